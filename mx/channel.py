"""Per-channel symmetric integer weight formats (``int4``, ``int8_pc``), as LOTION and most
post-training quantization papers evaluate them.

One FP32 scale per slice along ``axis`` (for a Linear weight (out, in) and axis -1: one
per output channel) s = absmax / qmax; q = clamp(round(x / s), ±qmax) · s, qmax = 7 (int4)
or 127 (int8). The MX name ``int8`` (block 32, E8M0 scale) is a different format, kept.
"""

from __future__ import annotations

import torch

from mx import stochastic
from mx.spec import ROUNDINGS

QMAX = {"int4": 7, "int8_pc": 127}


def scale(x: torch.Tensor, fmt: str, axis: int = -1) -> torch.Tensor:
    """The per-channel scale of ``x`` (absmax / qmax along ``axis``; 1 for zero channels)."""
    amax = x.detach().float().abs().amax(dim=axis, keepdim=True)
    return torch.where(amax > 0, amax / QMAX[fmt], 1.0)


def quantize_channel(
    x: torch.Tensor,
    fmt: str,
    *,
    axis: int = -1,
    rounding: str = "even",
    generator: stochastic.Generator = None,
) -> torch.Tensor:
    """Fake-quantize ``x`` to a per-channel integer format; same shape and dtype."""
    if fmt not in QMAX:
        raise ValueError(f"unknown per-channel format {fmt!r}; allowed: {', '.join(QMAX)}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; allowed: {', '.join(ROUNDINGS)}")
    s = scale(x, fmt, axis)
    steps = x.detach().float().abs() / s
    if rounding == "stochastic":
        q = stochastic.round_steps(steps, stochastic.uniform_like(steps, generator))
    elif rounding == "even":
        q = torch.round(steps)
    else:
        q = torch.floor(steps + 0.5)
    out = torch.copysign(q.clamp_max(QMAX[fmt]) * s, x.detach().float())
    return out.to(x.dtype)


def sr_variance(w: torch.Tensor, fmt: str, axis: int = -1) -> torch.Tensor:
    """Per-element stochastic-rounding variance (w − lo)(hi − w) with the scale held fixed;
    differentiable in ``w`` (LOTION's smoothing term)."""
    s = scale(w, fmt, axis)
    steps = w.abs() / s
    low = torch.floor(steps.detach())
    return (steps - low) * (low + 1 - steps) * s * s
