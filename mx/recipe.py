"""Per-model pieces of the low-precision recipes beyond the paper's MX setup.

``QuantAux`` is what every quantized module of one model shares: the stochastic-rounding
noise source and the random Hadamard block of the weight-gradient GEMM. ``keep_bf16`` globs
pick modules that run in bf16 instead (first/last blocks, the LM head); a negative index
into a module list counts from its end (``blocks.-1``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase

import torch
from torch import nn

from mx.hadamard import rht_matrix
from mx.spec import PrecisionSpec
from mx.stochastic import NoiseSource

# Offsets the RHT sign seed from the run seed so signs and rounding draws are unrelated.
_RHT_SEED_OFFSET = 0x5EED


@dataclass
class QuantAux:
    """Shared state of one quantized model: SR noise and the RHT block (None when unused)."""

    noise: NoiseSource | None = None
    rht: torch.Tensor | None = None
    _rht_on: dict[str, torch.Tensor] = field(default_factory=dict)

    def generator(self, device: torch.device) -> torch.Generator | None:
        """The SR generator for ``device`` (None: the spec rounds deterministically)."""
        return None if self.noise is None else self.noise.generator(device)

    def rht_block(self, device: torch.device) -> torch.Tensor:
        """The 16x16 RHT block on ``device`` (cached)."""
        key = str(device)
        if key not in self._rht_on:
            self._rht_on[key] = self.rht.to(device)
        return self._rht_on[key]


def make_aux(spec: PrecisionSpec, seed: int) -> QuantAux:
    """The shared state ``spec`` needs, seeded from ``seed`` (the run seed)."""
    noise = NoiseSource(seed) if spec.stochastic else None
    rht = rht_matrix(seed + _RHT_SEED_OFFSET) if spec.hadamard_wgrad else None
    return QuantAux(noise=noise, rht=rht)


def bf16_spec(spec: PrecisionSpec) -> PrecisionSpec:
    """``spec`` with every GEMM operand in bf16 (what a ``keep_bf16`` module runs under)."""
    formats = dict.fromkeys(("w_fmt", "a_fmt", "grad_fmt", "bwd_w_fmt", "bwd_a_fmt"), "bf16")
    changes = {**formats, "hadamard_wgrad": False, "keep_bf16": (), "grad_rounding": None}
    if spec.rounding == "stochastic":
        changes["rounding"] = "even"
    if spec.ln == "mx":
        changes["ln"] = "bf16"
    return PrecisionSpec.model_validate({**spec.model_dump(), **changes})


def _aliases(model: nn.Module) -> dict[str, set[str]]:
    """Every module name plus its spellings with negative indices into ModuleLists
    (``blocks.-1`` is the last block), so one glob fits models of any depth."""
    aliases: dict[str, set[str]] = {"": {""}}
    for name, module in model.named_modules():
        for child, _ in module.named_children():
            full = f"{name}.{child}" if name else child
            spellings = {child}
            if isinstance(module, nn.ModuleList | nn.Sequential) and child.isdigit():
                spellings.add(str(int(child) - len(module)))
            aliases[full] = {f"{p}.{c}" if p else c for p in aliases[name] for c in spellings}
    return aliases


class UnmatchedGlobs(ValueError):
    """``keep_bf16`` globs that match no module; ``names`` are the model's module names."""

    def __init__(self, globs: list[str], names: list[str]) -> None:
        self.globs, self.names = globs, names
        more = " ..." if len(names) > 12 else ""
        super().__init__(
            f"precision.keep_bf16: {globs} match no module; module names look "
            f"like: {', '.join(names[:12])}{more}"
        )


def kept_modules(model: nn.Module, globs: tuple[str, ...]) -> set[int]:
    """ids of the modules whose name, or an ancestor's, matches one of ``globs``
    (UnmatchedGlobs when a glob matches none)."""
    kept: set[int] = set()
    unmatched = set(globs)
    aliases = _aliases(model)
    for name, module in model.named_modules():
        spellings = aliases[name] if name else set()
        hits = {g for g in globs if any(fnmatchcase(n, g) for n in spellings)}
        unmatched -= hits
        parent = name.rpartition(".")[0]
        parent_kept = bool(name) and id(model.get_submodule(parent)) in kept
        if hits or parent_kept:
            kept.add(id(module))
    if unmatched:
        raise UnmatchedGlobs(sorted(unmatched), [n for n, _ in model.named_modules() if n])
    return kept


def _aux_of(model: nn.Module) -> QuantAux | None:
    for module in model.modules():
        aux = getattr(module, "mx_aux", None)
        if aux is not None:
            return aux
    return None


def rounding_state(model: nn.Module) -> dict[str, object] | None:
    """The stochastic-rounding stream position of a quantized ``model`` (None: no SR)."""
    aux = _aux_of(model)
    return None if aux is None or aux.noise is None else aux.noise.state_dict()


def load_rounding_state(model: nn.Module, state: dict[str, object]) -> None:
    """Continue the stochastic-rounding stream saved by ``rounding_state``."""
    aux = _aux_of(model)
    if aux is None or aux.noise is None:
        raise ValueError("the model does not round stochastically; nothing to restore")
    aux.noise.load_state_dict(state)
