"""NVFP4 fake-quantization: E2M1 elements, 16-element blocks, E4M3 block scale, FP32
per-tensor scale (NVIDIA's two-level scaling, as torchao's ``NVFP4Tensor`` computes it).

Per tensor: s_t = amax(|x|) / (448 · 6) (FP32). Per block b: s_b = E4M3(clamp(amax_b / 6 /
s_t, 2^-6, 448)) (round-to-nearest-even cast). Elements: q = E2M1(clamp(x · ((1 / s_t) /
s_b), ±6)); the value is q · (s_t · s_b). The operation order is torchao's (a reciprocal
multiply, not a division), which is what makes the result bit-exact against it. Blocks are
1x16 along an axis or, for weights, 16x16 tiles so that a matrix and its transpose share
one quantization. An all-zero tensor stays zero (torchao divides 0/0 there and returns
NaN); a NaN/Inf makes its block NaN, and the tensor scale is taken over finite values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mx import stochastic
from mx.formats import ELEM_FORMATS
from mx.quantizer import _round_magnitude
from mx.spec import ROUNDINGS

BLOCK = 16
E2M1 = ELEM_FORMATS["fp4_e2m1"]
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_TINY = 2.0**-6  # smallest normal E4M3: block scales never go subnormal
LAYOUTS = ("1x16", "16x16")


def tensor_scale(amax: torch.Tensor) -> torch.Tensor:
    """The FP32 per-tensor scale from the tensor's amax (block scales then use all of E4M3)."""
    return amax.float() / (E4M3_MAX * E2M1_MAX)


def quantize_nvfp4(
    x: torch.Tensor,
    *,
    axis: int = -1,
    layout: str = "1x16",
    rounding: str = "even",
    generator: stochastic.Generator = None,
) -> torch.Tensor:
    """Fake-quantize ``x`` to NVFP4; same shape and dtype.

    ``layout`` "1x16" blocks 16 elements along ``axis`` (ragged blocks are zero-padded);
    "16x16" tiles a 2-D tensor (weights). ``rounding`` applies to the E2M1 elements (the
    block scales are always round-to-nearest-even).
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; allowed: {', '.join(ROUNDINGS)}")
    blocks, restore = _blocks(x, axis, layout)
    return restore(_quantize(blocks, rounding, generator))


def clip_rate_nvfp4(x: torch.Tensor, *, axis: int = -1, layout: str = "1x16") -> float:
    """Fraction of elements clamped to ±6 after scaling (a block scale rounded down)."""
    if x.numel() == 0:
        return 0.0
    blocks, _ = _blocks(x, axis, layout)
    bad, _, scaled = _scaled(blocks)
    return float(((scaled.abs() > E2M1_MAX) & ~bad).sum().item()) / x.numel()


def _blocks(x: torch.Tensor, axis: int, layout: str):
    """(rows, n_blocks, elements per block) float32 view of ``x`` and its inverse."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown NVFP4 layout {layout!r}; allowed: {', '.join(LAYOUTS)}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} out of range for a tensor of rank {x.ndim}")
    data = x.detach().float()
    if layout == "16x16":
        if x.ndim != 2:
            raise ValueError(
                f"the 16x16 NVFP4 layout needs a 2-D tensor, got shape {tuple(x.shape)}"
            )
        return _tiles(x, data)
    moved = data.movedim(axis, -1)
    moved_shape = moved.shape
    n = moved_shape[-1]
    pad = -n % BLOCK
    flat = F.pad(moved.reshape(-1, n), (0, pad))
    blocks = flat.view(flat.shape[0], -1, BLOCK)

    def restore(out: torch.Tensor) -> torch.Tensor:
        out = out.reshape(-1, n + pad)[:, :n].reshape(moved_shape)
        return out.movedim(-1, axis).to(x.dtype)

    return blocks, restore


def _tiles(x: torch.Tensor, data: torch.Tensor):
    rows, cols = data.shape
    pad_r, pad_c = -rows % BLOCK, -cols % BLOCK
    padded = F.pad(data, (0, pad_c, 0, pad_r))
    r, c = padded.shape
    tiles = padded.view(r // BLOCK, BLOCK, c // BLOCK, BLOCK).transpose(1, 2)
    blocks = tiles.reshape(r // BLOCK, c // BLOCK, BLOCK * BLOCK)

    def restore(out: torch.Tensor) -> torch.Tensor:
        out = out.view(r // BLOCK, c // BLOCK, BLOCK, BLOCK).transpose(1, 2).reshape(r, c)
        return out[:rows, :cols].to(x.dtype)

    return blocks, restore


def _scaled(blocks: torch.Tensor):
    """Per-block NaN flag, the dequantization scale s_t·s_b and the scaled elements."""
    bad, inverse, scale = block_scales(blocks)
    return bad, scale, blocks * inverse


def block_scales(blocks: torch.Tensor):
    """Per-block NaN flag, the multiplier (1/s_t)/s_b that scales the elements (torchao's
    operation order) and the dequantization scale s_t·s_b."""
    mag = blocks.abs()
    bad = ~torch.isfinite(mag).all(dim=-1, keepdim=True)
    finite = torch.where(torch.isfinite(mag), mag, 0.0)
    s_t = tensor_scale(finite.amax())
    # An all-zero tensor: any positive tensor scale gives zero blocks (0/0 otherwise).
    s_t = torch.where(s_t > 0, s_t, 1.0)
    block_amax = finite.amax(dim=-1, keepdim=True)
    s_b = (block_amax / E2M1_MAX / s_t).clamp(E4M3_TINY, E4M3_MAX)
    s_b = s_b.to(torch.float8_e4m3fn).float()
    return bad, (1.0 / s_t) / s_b, s_t * s_b


def _quantize(blocks: torch.Tensor, rounding: str, generator: stochastic.Generator):
    bad, scale, scaled = _scaled(blocks)
    mag = scaled.abs().clamp_max(E2M1_MAX)
    noise = stochastic.uniform_like(mag, generator) if rounding == "stochastic" else None
    q = _round_magnitude(mag, E2M1, rounding, noise).clamp_max(E2M1_MAX)
    out = torch.copysign(q, blocks) * scale
    return torch.where(bad, torch.nan, out)
