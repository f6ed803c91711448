"""MX fake-quantization: ``quantize`` (value emulation) and ``clip_rate`` (overflow statistic).

Everything is computed on float32 bit patterns with exact power-of-two arithmetic, so
the result is bit-exact (no log2, no float->e8m0 casts). The block kernel is pure torch
and is run either eagerly (the reference) or through ``torch.compile`` for large tensors
(see ``mx.fast``), which must give identical bits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mx import fast, stochastic
from mx.formats import E8M0_BIAS, E8M0_MAX_EXP, E8M0_MIN_EXP, ElemFormat, elem_format
from mx.spec import (
    CHANNEL_FORMATS,
    MX_FORMATS,
    NV_FORMATS,
    ROUNDINGS,
    SCALE_RULES,
    check_format,
)

_EXP_MASK = 0xFF
_MANT_MASK = 0x7FFFFF
_HALF_SUBNORMAL = 0x400000  # bits of 2^-127, the smallest E8M0 scale
_HALF_SUBNORMAL_F32 = 2.0**-127


def quantize(
    x: torch.Tensor,
    fmt: str,
    *,
    block_size: int = 32,
    axis: int = -1,
    scale_rule: str = "floor",
    rounding: str = "even",
    generator: stochastic.Generator = None,
) -> torch.Tensor:
    """Fake-quantize ``x`` to ``fmt``; returns a tensor of the same shape and dtype.

    MX formats use blocks of ``block_size`` along ``axis`` (a ragged last block is padded
    with zeros internally) sharing one E8M0 scale chosen by ``scale_rule``; elements are
    rounded by ``rounding`` and saturated to the format's max normal. A NaN/Inf anywhere
    in a block makes the whole block NaN. "bf16"/"fp16" round element-wise (overflow to
    Inf like a cast); "fp32" returns ``x`` itself. ``rounding="stochastic"`` rounds up
    with probability equal to the fractional distance, drawing from ``generator`` (a
    torch.Generator, an int seed, or None for torch's global generator; see
    ``mx.stochastic``). "nvfp4" is NVIDIA's two-level format in 1x16 blocks along
    ``axis`` (``block_size`` and ``scale_rule`` do not apply; see ``mx.nvfp4``); "int4"
    and "int8_pc" scale each slice along ``axis`` by its absmax (``mx.channel``).
    """
    check_format(fmt)
    _check_options(scale_rule, rounding)
    _check_layout(x, block_size, axis)
    if fmt == "fp32":
        return x
    if fmt in ("bf16", "fp16"):
        return _round_elementwise(x, fmt, rounding, generator)
    if fmt in NV_FORMATS:
        from mx.nvfp4 import quantize_nvfp4

        return quantize_nvfp4(x, axis=axis, rounding=rounding, generator=generator)
    if fmt in CHANNEL_FORMATS:
        from mx.channel import quantize_channel

        return quantize_channel(x, fmt, axis=axis, rounding=rounding, generator=generator)
    if scale_rule == "paper_bump":
        from mx import paper

        return paper.bump_quantize(x, fmt, block_size=block_size, axis=axis, rounding=rounding)
    fmt_info = elem_format(fmt)
    blocks, restore = _to_blocks(x, block_size, axis)
    if rounding == "stochastic":
        # The draws are a tensor input, which the compiled path does not take: eager.
        noise = stochastic.uniform_like(blocks, generator)
        return restore(_quantize_blocks(blocks, fmt_info, scale_rule, rounding, noise))
    out = fast.run(_quantize_blocks, blocks, fmt_info, scale_rule, rounding)
    return restore(out)


def clip_rate(
    x: torch.Tensor,
    fmt: str,
    *,
    block_size: int = 32,
    axis: int = -1,
    scale_rule: str = "floor",
) -> float:
    """Fraction of elements of ``x`` whose scaled magnitude exceeds ``fmt``'s max normal.

    These are the elements that ``quantize`` saturates (the paper's "clip rate"); 0.0 for
    element-wise formats, which have no block scale. NaN blocks count as not clipped.
    """
    check_format(fmt)
    _check_options(scale_rule, "even")
    _check_layout(x, block_size, axis)
    if x.numel() == 0:
        return 0.0
    if fmt in NV_FORMATS:
        from mx.nvfp4 import clip_rate_nvfp4

        return clip_rate_nvfp4(x, axis=axis)
    if fmt not in MX_FORMATS:
        return 0.0
    if scale_rule == "paper_bump":
        from mx import paper

        return paper.bump_clipped(x, fmt, block_size=block_size, axis=axis) / x.numel()
    fmt_info = elem_format(fmt)
    blocks, _ = _to_blocks(x, block_size, axis)
    clipped = fast.run(_count_clipped, blocks, fmt_info, scale_rule)
    return float(clipped.item()) / x.numel()


def e8m0_ceil_exponent(bits: torch.Tensor) -> torch.Tensor:
    """Biased E8M0 exponent of ``ceil_pow2(v)`` for positive float32 ``v`` given as int32 bits.

    Subnormal inputs up to 2^-127 map to 0 (the smallest scale), anything above to 1;
    normal inputs round up unless their mantissa is zero. 255 (NaN) is returned for values
    above 2^127, the caller saturates.
    """
    exp = (bits >> 23) & _EXP_MASK
    mant = bits & _MANT_MASK
    subnormal = (mant > _HALF_SUBNORMAL).to(torch.int32)
    return torch.where(exp == 0, subnormal, exp + (mant != 0).to(torch.int32))


def _check_options(scale_rule: str, rounding: str) -> None:
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"unknown scale_rule {scale_rule!r}; allowed: {', '.join(SCALE_RULES)}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; allowed: {', '.join(ROUNDINGS)}")


def _check_layout(x: torch.Tensor, block_size: int, axis: int) -> None:
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(
            f"axis {axis} out of range for a tensor of rank {x.ndim}; "
            f"allowed: {-x.ndim}..{x.ndim - 1}"
        )
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype {x.dtype} not supported; allowed: float32, bfloat16, float16")


def _to_blocks(x: torch.Tensor, block_size: int, axis: int):
    """View ``x`` as float32 (pre, n_blocks, block_size, post) plus a function undoing it."""
    axis %= x.ndim
    shape = x.shape
    n = shape[axis]
    pre = shape[:axis].numel()
    post = shape[axis + 1 :].numel()
    # quantize is not differentiable; detaching also keeps compiled guards grad-agnostic
    flat = x.detach().float().reshape(pre, n, post)
    pad = -n % block_size
    if pad:
        flat = F.pad(flat, (0, 0, 0, pad))
    blocks = flat.view(pre, (n + pad) // block_size, block_size, post)

    def restore(out: torch.Tensor) -> torch.Tensor:
        out = out.view(pre, n + pad, post)
        if pad:
            out = out[:, :n]
        return out.reshape(shape).to(x.dtype)

    return blocks, restore


def _pow2_normal(exp: torch.Tensor) -> torch.Tensor:
    """Exact float32 2**exp for int32 ``exp`` in [-126, 127]."""
    return ((exp + E8M0_BIAS) << 23).view(torch.float32)


def _pow2(exp: torch.Tensor) -> torch.Tensor:
    """Exact float32 2**exp for int32 ``exp`` in [-127, 127] (2^-127 is subnormal)."""
    return torch.where(exp == E8M0_MIN_EXP, _HALF_SUBNORMAL_F32, _pow2_normal(exp))


def _scale_exponent(amax: torch.Tensor, fmt: ElemFormat, scale_rule: str) -> torch.Tensor:
    """Unbiased E8M0 exponent per block, clamped to the finite E8M0 range."""
    bits = amax.view(torch.int32)
    if scale_rule == "rceil":
        descale = (amax / fmt.max_normal).view(torch.int32)
        exp = e8m0_ceil_exponent(descale) - E8M0_BIAS
    elif scale_rule == "ceil":
        exp = e8m0_ceil_exponent(bits) - E8M0_BIAS - fmt.emax
    else:
        if scale_rule == "even":
            # Round amax to the element's mantissa width first (carry may bump the exponent).
            bits = bits + (1 << (22 - fmt.mbits))
        exp = ((bits >> 23) & _EXP_MASK) - E8M0_BIAS - fmt.emax
    return exp.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)


def _scaled(blocks: torch.Tensor, fmt: ElemFormat, scale_rule: str):
    """Per-block NaN/Inf flag, scale exponent, and the elements divided by their scale."""
    amax = blocks.abs().amax(dim=2, keepdim=True)
    # Compiled reductions may return a NaN with the sign bit set, so mask it off.
    bad_block = (amax.view(torch.int32) & 0x7FFFFFFF) >= 0x7F800000
    scale_exp = _scale_exponent(amax, fmt, scale_rule)
    return bad_block, scale_exp, blocks * _pow2(-scale_exp)


def grid_spacing(mag: torch.Tensor, fmt: ElemFormat) -> torch.Tensor:
    """Spacing of the element grid around non-negative ``mag`` (unsaturated): uniform for
    INT8, else 2^(max(e, emin) - mbits) for exponent e (the subnormal spacing below emin)."""
    if fmt.is_int:
        return torch.full_like(mag, 2.0**fmt.quantum_floor)
    exp = ((mag.view(torch.int32) >> 23) & _EXP_MASK) - E8M0_BIAS
    # step exponent >= emin - mbits >= -16: a normal float32 power of two
    return _pow2_normal(exp.clamp_min(fmt.emin) - fmt.mbits)


def _round_magnitude(
    mag: torch.Tensor, fmt: ElemFormat, rounding: str, noise: torch.Tensor | None = None
) -> torch.Tensor:
    """Round non-negative ``mag`` to the element grid (no saturation); ``noise`` holds the
    uniform draws of stochastic rounding."""
    quantum = grid_spacing(mag, fmt)
    # exact (a power of two); one bit-cast fewer than multiplying by 2^-step
    steps = mag / quantum
    # steps < 2^(mbits+1) here, so +0.5 is exact and floor() gives round-half-away.
    if rounding == "stochastic":
        rounded = stochastic.round_steps(steps, noise)
    else:
        rounded = torch.round(steps) if rounding == "even" else torch.floor(steps + 0.5)
    return rounded * quantum


def _quantize_blocks(
    blocks: torch.Tensor,
    fmt: ElemFormat,
    scale_rule: str,
    rounding: str,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fake-quantize a float32 (pre, n_blocks, block, post) tensor; the exact reference."""
    bad_block, scale_exp, scaled = _scaled(blocks, fmt, scale_rule)
    mag = _round_magnitude(scaled.abs(), fmt, rounding, noise).clamp_max(fmt.max_normal)
    out = torch.copysign(mag * _pow2(scale_exp), blocks)
    return torch.where(bad_block, torch.nan, out)


def _count_clipped(blocks: torch.Tensor, fmt: ElemFormat, scale_rule: str) -> torch.Tensor:
    """Number of elements whose scaled magnitude exceeds the max normal (NaN blocks: none)."""
    bad_block, _, scaled = _scaled(blocks, fmt, scale_rule)
    return ((scaled.abs() > fmt.max_normal) & ~bad_block).sum()


def _round_elementwise(
    x: torch.Tensor, fmt: str, rounding: str, generator: stochastic.Generator = None
) -> torch.Tensor:
    """Round every element to bf16/fp16, keeping x's dtype."""
    target = torch.bfloat16 if fmt == "bf16" else torch.float16
    if x.dtype == target:
        return x
    if rounding == "stochastic":
        flat = x.detach().float().reshape(-1)
        if fmt == "bf16":
            out = stochastic.round_bf16(flat, generator)
        else:
            out = _round_fp16(flat, "stochastic", stochastic.uniform_like(flat, generator))
        return out.view(x.shape).to(x.dtype)
    if rounding == "even":
        return x.to(target).to(x.dtype)
    kernel = _round_bf16_half_away if fmt == "bf16" else _round_fp16_half_away
    flat = x.detach().float().reshape(-1)
    return fast.run(kernel, flat, static_dims=()).view(x.shape).to(x.dtype)


def _round_bf16_half_away(x32: torch.Tensor) -> torch.Tensor:
    # Adding half an ulp to the magnitude bits then truncating rounds ties away from
    # zero, subnormals included; NaN payloads could collapse to Inf, so keep them.
    bits = (x32.view(torch.int32) + 0x8000) & -0x10000
    return torch.where(torch.isnan(x32), x32, bits.view(torch.float32))


_FP16 = ElemFormat("fp16", 5, 10, emax=15, emin=-14, max_normal=65504.0)


def _round_fp16_half_away(x32: torch.Tensor) -> torch.Tensor:
    return _round_fp16(x32, "half_away")


def _round_fp16(x32: torch.Tensor, rounding: str, noise: torch.Tensor | None = None):
    mag = x32.abs()
    # Exponents far above fp16's range would overflow the 2^-step factor: they go to Inf.
    finite_range = mag < 65520.0
    safe = torch.where(finite_range, mag, 0.0)
    rounded = _round_magnitude(safe, _FP16, rounding, noise)
    rounded = torch.where(finite_range & (rounded <= _FP16.max_normal), rounded, torch.inf)
    return torch.where(torch.isnan(x32), x32, torch.copysign(rounded, x32))
