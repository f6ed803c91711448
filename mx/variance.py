"""Stochastic-rounding variance of every element on a format's grid, the scale held fixed.

For an element whose scaled magnitude m lies between two neighbouring grid points lo <= m <
hi (spacing q = hi - lo), stochastic rounding picks hi with probability (m - lo) / q, so
Var[Q(x)] = (m - lo)(hi - m) · scale². The spacing is the one the quantizer rounds with:
uniform for the integer grids, 2^(max(e, emin) - mbits) around |x|/scale for the float
elements (e the exponent of m; below emin the subnormal spacing), and the variance is 0
where the quantizer saturates (m >= the largest element value: SR always returns it) and on
grid points. The scale is the one ``mx.quantize`` computes (per channel, the E8M0 scale
of an MX block, or NVFP4's tensor x block scale) and is held fixed: the result is
differentiable in x through m only, which is what LOTION's smoothing term needs.
"""

from __future__ import annotations

import torch

from mx import channel, nvfp4
from mx.formats import elem_format
from mx.quantizer import _check_layout, _pow2, _scaled, _to_blocks, grid_spacing
from mx.spec import CHANNEL_FORMATS, NV_FORMATS, SCALED_FORMATS

# The E8M0 rules of mx.quantizer (the paper's E4M3 bump has its own kernel, not covered).
_SCALE_RULES = ("floor", "rceil", "ceil", "even")


def sr_variance(
    x: torch.Tensor,
    fmt: str,
    *,
    block_size: int = 32,
    axis: int = -1,
    scale_rule: str = "floor",
) -> torch.Tensor:
    """Per-element Var[Q(x)] of ``mx.quantize(x, fmt, rounding="stochastic")`` (same
    layout arguments; NVFP4 in 1x16 blocks along ``axis``), differentiable in ``x``."""
    if fmt not in SCALED_FORMATS:
        raise ValueError(
            f"format {fmt!r} has no scaled grid to round on; allowed: {', '.join(SCALED_FORMATS)}"
        )
    if scale_rule not in _SCALE_RULES:
        raise ValueError(f"unknown scale_rule {scale_rule!r}; allowed: {', '.join(_SCALE_RULES)}")
    _check_layout(x, block_size, axis)
    if fmt in CHANNEL_FORMATS:
        return channel.sr_variance(x, fmt, axis)
    if fmt in NV_FORMATS:
        inverse, scale = _nvfp4_scales(x, axis)
        fmt_info = nvfp4.E2M1
    else:
        fmt_info = elem_format(fmt)
        inverse, scale = _mx_scales(x, fmt, block_size, axis, scale_rule)
    m = x.float().abs() * inverse
    quantum = grid_spacing(m.detach(), fmt_info)
    low = torch.floor(m.detach() / quantum) * quantum
    var = (m - low) * (low + quantum - m)
    var = torch.where(m.detach() < fmt_info.max_normal, var, 0.0)
    return (var * scale * scale).to(x.dtype)


def _mx_scales(x: torch.Tensor, fmt: str, block_size: int, axis: int, scale_rule: str):
    """Per-element 1/scale and scale of the MX blocks of ``x`` (exact powers of two)."""
    blocks, restore = _to_blocks(x.detach().float(), block_size, axis)
    _, scale_exp, _ = _scaled(blocks, elem_format(fmt), scale_rule)
    return _spread(_pow2(-scale_exp), blocks, restore), _spread(_pow2(scale_exp), blocks, restore)


def _nvfp4_scales(x: torch.Tensor, axis: int):
    """Per-element multiplier (1/s_t)/s_b and dequantization scale s_t·s_b of NVFP4's 1x16
    blocks (the quantizer's own, so m is its scaled value bit for bit)."""
    blocks, restore = nvfp4._blocks(x.detach().float(), axis, "1x16")
    _, inverse, scale = nvfp4.block_scales(blocks)
    return _spread(inverse, blocks, restore), _spread(scale, blocks, restore)


def _spread(per_block: torch.Tensor, blocks: torch.Tensor, restore) -> torch.Tensor:
    """A per-block value repeated over the block's elements, in the layout of the input."""
    return restore(per_block.expand(blocks.shape).contiguous())
