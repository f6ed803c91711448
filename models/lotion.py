"""LOTION (Kwun et al. 2025, arXiv 2510.08757) and quantized evaluation.

LOTION trains on the quantized loss smoothed by unbiased randomized rounding,
E_ε[L(w + ε)] with ε the stochastic-rounding noise of each weight on the target grid
(mean 0, variance σ_i² = (w_i − lo_i)(hi_i − w_i), the scale held fixed). Its second-order
form, built here, is L(w) + ½·Σ_i g_ii·σ_i²(w). For g_ii (the diagonal curvature) we use
the bias-corrected Adam second moment v̂_i ≈ E[g_i²], the empirical-Fisher diagonal: it
is already tracked by the optimizer, costs nothing, is non-negative (so the term is a
valid smoother) and approximates the Gauss-Newton diagonal for the log-loss. The term
pulls each weight toward its nearest grid point, harder where the loss is curved. Before
the first update v̂ is undefined and the term is zero.

``quantized_weights`` casts every Linear weight to a format with round-to-nearest for an
evaluation (the deployed quantized model) and restores the weights after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from mx.channel import QMAX, sr_variance

LOTION_FORMATS = tuple(QMAX)


def linear_weights(model: nn.Module) -> list[nn.Parameter]:
    """The weights LOTION smooths and quantized evaluation casts: every Linear's."""
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear)]


def lotion_penalty(
    model: nn.Module, optimizer: torch.optim.Optimizer, fmt: str, strength: float
) -> torch.Tensor:
    """strength · ½ Σ v̂_i σ_i²(w_i) over the Linear weights (differentiable in w)."""
    total = torch.zeros(())
    for group in optimizer.param_groups:
        beta2 = group["betas"][1]
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            if "exp_avg_sq" not in state or not any(param is w for w in linear_weights(model)):
                continue
            step = float(state["step"])
            v_hat = state["exp_avg_sq"] / (1 - beta2**step)
            term = (v_hat * sr_variance(param, fmt)).sum()
            total = total.to(term.device) + term
    return 0.5 * strength * total


@contextlib.contextmanager
def quantized_weights(model: nn.Module, fmt: str) -> Iterator[None]:
    """Within the block every Linear weight holds its round-to-nearest ``fmt`` value."""
    import mx

    weights = linear_weights(model)
    saved = [w.detach().clone() for w in weights]
    try:
        with torch.no_grad():
            for w in weights:
                w.copy_(mx.quantize(w, fmt, rounding="even"))
        yield
    finally:
        with torch.no_grad():
            for w, original in zip(weights, saved, strict=True):
                w.copy_(original)
