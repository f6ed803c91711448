"""Stochastic rounding: the noise it needs and the rounding rule itself.

A value at ``steps`` grid units (``floor(steps) <= steps < floor(steps) + 1``) rounds up
with probability ``steps - floor(steps)``, so E[Q(x)] = x and Var[Q(x)] =
(x - q_lo)(q_hi - x) in grid units. The uniform draws come from an explicit
``torch.Generator`` so a run is reproducible and, with ``NoiseSource.state_dict`` saved in
its checkpoints, resumes on the same random stream.
"""

from __future__ import annotations

import torch

Generator = torch.Generator | int | None


def resolve(generator: Generator, device: torch.device) -> torch.Generator | None:
    """``generator`` as a torch.Generator: an int is a seed for a fresh one on ``device``."""
    if isinstance(generator, bool) or not isinstance(generator, torch.Generator | int | None):
        raise ValueError(
            f"generator must be a torch.Generator, an int seed or None, got {generator!r}"
        )
    if isinstance(generator, int):
        return torch.Generator(device).manual_seed(generator)
    return generator


def uniform_like(x: torch.Tensor, generator: Generator) -> torch.Tensor:
    """float32 draws in [0, 1) shaped like ``x`` (multiples of 2^-24, so exact in float32)."""
    gen = resolve(generator, x.device)
    return torch.rand(x.shape, generator=gen, device=x.device, dtype=torch.float32)


def round_steps(steps: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Stochastically round non-negative ``steps`` (grid units) to integers.

    ``frac`` is exact in float32 (steps has few integer bits), and ``noise < frac`` holds
    with probability ``frac`` up to the 2^-24 granularity of the draws.
    """
    low = torch.floor(steps)
    return low + (noise < steps - low).to(steps.dtype)


def round_bf16(x32: torch.Tensor, generator: Generator) -> torch.Tensor:
    """Stochastically round float32 to bf16 values: add 16 random low bits, truncate.

    Magnitudes are rounded on the bit pattern (monotone in the value), so the rule is the
    same as ``round_steps`` on the bf16 grid, subnormals included; overflow of the largest
    finite binade goes to Inf like a cast, NaN stays NaN.
    """
    gen = resolve(generator, x32.device)
    low_bits = torch.randint(0, 1 << 16, x32.shape, generator=gen, device=x32.device)
    bits = (x32.view(torch.int32) + low_bits.to(torch.int32)) & -0x10000
    return torch.where(torch.isfinite(x32), bits.view(torch.float32), x32)


class NoiseSource:
    """One seed, a lazily created ``torch.Generator`` per device, checkpointable state.

    ``mx.apply`` shares one source between all quantized modules of a model, so the draws
    are a single stream in the model's (deterministic) call order.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._generators: dict[str, torch.Generator] = {}
        self._pending: dict[str, torch.Tensor] = {}

    def generator(self, device: torch.device) -> torch.Generator:
        """The generator for ``device``, created (and seeded, or restored) on first use."""
        key = str(device)
        gen = self._generators.get(key)
        if gen is None:
            gen = self._generators[key] = torch.Generator(device).manual_seed(self.seed)
            if key in self._pending:
                gen.set_state(self._pending.pop(key))
        return gen

    def state_dict(self) -> dict[str, object]:
        """Seed and every generator's state (CPU byte tensors), for checkpoints."""
        states = {key: gen.get_state() for key, gen in self._generators.items()}
        return {"seed": self.seed, "states": {**self._pending, **states}}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Continue the streams saved by ``state_dict`` (devices not used yet restore lazily)."""
        self.seed = int(state["seed"])
        self._generators.clear()
        self._pending = dict(state["states"])
