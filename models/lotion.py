"""LOTION (Kwun et al. 2025, arXiv 2510.08757) and quantized evaluation.

LOTION trains on the quantized loss smoothed by unbiased randomized rounding,
E_ε[L(w + ε)] with ε the stochastic-rounding noise of each weight on the target grid
(mean 0, variance σ_i² = (w_i − lo_i)(hi_i − w_i), the scale held fixed; mx.variance has
it for every scaled format: per-channel INT, MX blocks, NVFP4). Two forms:

- ``second_order`` (default): L(w) + ½·Σ_i g_ii·σ_i²(w). For g_ii (the diagonal
  curvature) we use the bias-corrected Adam second moment v̂_i ≈ E[g_i²], the
  empirical-Fisher diagonal: it is already tracked by the optimizer, costs nothing, is
  non-negative (so the term is a valid smoother) and approximates the Gauss-Newton
  diagonal for the log-loss. The term pulls each weight toward its nearest grid point,
  harder where the loss is curved. Before the first update v̂ is undefined and the term
  is zero.
- ``monte_carlo``: one sample of the expectation per step: the forward and backward
  passes see the weights stochastically rounded to the target grid (a seeded stream,
  saved in checkpoints), and the gradient at w + ε updates the full-precision w.

``quantized_weights`` casts every Linear weight to a format with round-to-nearest for an
evaluation (the deployed quantized model) and restores the weights after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from models.config import LotionConfig
from models.distributed import full
from mx.stochastic import Generator, NoiseSource
from mx.variance import sr_variance

if TYPE_CHECKING:
    from models.replica import Replica

# Offsets the Monte-Carlo stream from the run seed (unrelated to the MX rounding stream).
_NOISE_SEED_OFFSET = 0x107


def linear_weights(model: nn.Module) -> list[nn.Parameter]:
    """The weights LOTION smooths and quantized evaluation casts: every Linear's."""
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear)]


def lotion_penalty(
    model: nn.Module, optimizer: torch.optim.Optimizer, fmt: str, strength: float
) -> torch.Tensor:
    """strength · ½ Σ v̂_i σ_i²(w_i) over the Linear weights (differentiable in w); σ_i² is
    the variance of ``mx.quantize(w, fmt, rounding="stochastic")`` (see mx.variance)."""
    weights = {id(w) for w in linear_weights(model)}
    total = torch.zeros(())
    for group in optimizer.param_groups:
        beta2 = group["betas"][1]
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            if "exp_avg_sq" not in state or id(param) not in weights:
                continue
            step = float(state["step"])
            v_hat = full(state["exp_avg_sq"]) / (1 - beta2**step)
            # An FSDP shard is gathered (differentiably: each rank's gradient is its own
            # part), as block and tensor scales span shards; every rank computes the same sum.
            term = (v_hat * sr_variance(full(param), fmt)).sum()
            total = total.to(term.device) + term
    return 0.5 * strength * total


def _local(weight: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this rank's values (an FSDP shard's local part, else itself)."""
    from torch.distributed.tensor import DTensor

    return weight.to_local() if isinstance(weight, DTensor) else weight


def _cast(
    weight: torch.Tensor, fmt: str, rounding: str = "even", generator: Generator = None
) -> torch.Tensor:
    """This rank's part of the ``fmt`` value (``rounding``) of the whole ``weight``.

    An FSDP shard is gathered first (block and tensor scales span shards) and the result
    sharded the same way, so every rank holds its part of the single-process cast (with
    stochastic rounding every rank draws the same noise: the streams are seeded alike).
    """
    from torch.distributed.tensor import DTensor, Replicate

    import mx

    if not isinstance(weight, DTensor):
        return mx.quantize(weight, fmt, rounding=rounding, generator=generator)
    mesh = weight.device_mesh
    cast = mx.quantize(weight.full_tensor(), fmt, rounding=rounding, generator=generator)
    replicated = DTensor.from_local(cast, mesh, [Replicate()] * mesh.ndim, run_check=False)
    return replicated.redistribute(mesh, weight.placements).to_local()


@contextlib.contextmanager
def _cast_weights(
    model: nn.Module, fmt: str, rounding: str = "even", generator: Generator = None
) -> Iterator[None]:
    """Every Linear weight holds its ``fmt`` value within the block, restored after."""
    weights = linear_weights(model)
    saved = [_local(w).detach().clone() for w in weights]
    try:
        with torch.no_grad():
            for w in weights:
                _local(w).copy_(_cast(w, fmt, rounding, generator))
        yield
    finally:
        with torch.no_grad():
            for w, original in zip(weights, saved, strict=True):
                _local(w).copy_(original)


def quantized_weights(model: nn.Module, fmt: str) -> contextlib.AbstractContextManager[None]:
    """Within the block every Linear weight holds its round-to-nearest ``fmt`` value
    (sharded weights included: collective, every rank must enter)."""
    return _cast_weights(model, fmt)


class Lotion:
    """A run's LOTION term: ``sampled_weights`` around the forward and backward passes,
    ``add_gradient`` before the update; the Monte-Carlo stream in ``state_dict``."""

    def __init__(self, fmt: str, strength: float, form: str, seed: int) -> None:
        self.fmt, self.strength, self.form = fmt, strength, form
        self.noise = NoiseSource(seed + _NOISE_SEED_OFFSET) if form == "monte_carlo" else None
        # The last smoothing term (second-order form), for the ``lotion/penalty`` probe.
        self.penalty: torch.Tensor | None = None

    def sampled_weights(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Monte-Carlo form: the weights stochastically rounded to the target grid (one
        draw per step); the second-order form leaves them alone."""
        if self.noise is None:
            return contextlib.nullcontext()
        device = linear_weights(model)[0].device
        return _cast_weights(model, self.fmt, "stochastic", self.noise.generator(device))

    def add_gradient(self, replica: Replica) -> None:
        """Second-order form: backpropagate the smoothing term of the replica's current
        weights and optimizer state (the Monte-Carlo form has none)."""
        if self.noise is not None:
            return
        penalty = lotion_penalty(replica.model, replica.optimizer, self.fmt, self.strength)
        if penalty.requires_grad:
            penalty.backward()
        self.penalty = penalty

    def state_dict(self) -> dict[str, object] | None:
        """The Monte-Carlo stream position (None for the second-order form)."""
        return None if self.noise is None else self.noise.state_dict()

    def load_state_dict(self, state: dict[str, object] | None) -> None:
        if self.noise is not None and state is not None:
            self.noise.load_state_dict(state)


def make_lotion(cfg: LotionConfig | None, seed: int) -> Lotion | None:
    """The run's LOTION term from ``train.lotion`` (None when off)."""
    return None if cfg is None else Lotion(cfg.fmt, cfg.strength, cfg.form, seed)
