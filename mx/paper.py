"""The paper's own MX ops (Su et al. 2025's OLMo fork, ``olmo/mx``), as options.

What its code ran differs from the corrected (OCP) behaviour of ``mx.layers`` in ways that
change training dynamics; each is selected by a ``PrecisionSpec`` field (``profile: paper``
turns them all on):

- ``scale_rule="paper_bump"``: the "bump the exponent" arm. A block's FLOOR exponent is
  raised by one at every in-block position where the maximum magnitude *across the blocks*
  at that position has a mantissa above 1.75 (the max is taken over the block-index axis,
  not within the block). E4M3 only, as in the paper.
- ``pre_round="bf16"``: the MX Linear rounds x, W, b to bf16 before MX-quantizing them and
  grad_out before its backward; its forward-only mode runs the backward in FP32.
- ``ln_internals="bf16"``: LayerNorm computed op by op with every intermediate rounded to
  bf16, forward and backward; ``"bf16_tail"`` is the paper's "LN not quantized" path, which
  still rounds the normalisation tail (var + eps onwards) in the forward.
- ``ln_bias_grad=False``: the LayerNorm returns no bias gradient (the bias never trains).

Fixtures made from the paper's code pin these bit for bit (tests/data/paper_ops).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mx.formats import E8M0_BIAS, E8M0_MAX_EXP, E8M0_MIN_EXP, elem_format
from mx.quantizer import _pow2, _round_magnitude, _to_blocks, quantize
from mx.spec import PrecisionSpec

_BUMP_MANTISSA = 1.75


def _bump_scaled(blocks: torch.Tensor, fmt: str):
    """NaN-block flag, per-element scale exponent and scaled elements under the paper's bump."""
    if fmt != "fp8_e4m3":
        raise ValueError(
            f"scale_rule 'paper_bump' reproduces the paper's exponent bump, which only "
            f"supports fp8_e4m3; got format {fmt!r}"
        )
    info = elem_format(fmt)
    amax = blocks.abs().amax(dim=2, keepdim=True)
    bad_block = (amax.view(torch.int32) & 0x7FFFFFFF) >= 0x7F800000
    floor_exp = ((amax.view(torch.int32) >> 23) & 0xFF) - E8M0_BIAS
    # The paper's test uses float log2 (so magnitudes a hair below a power of two count
    # as the next binade); reproduce it rather than the exact mantissa comparison.
    col_max = blocks.abs().amax(dim=1, keepdim=True)
    bump = col_max > _BUMP_MANTISSA * (2.0 ** torch.floor(torch.log2(col_max)))
    exp = (floor_exp + bump.to(torch.int32) - info.emax).clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    return bad_block, exp, blocks * _pow2(-exp), info


def bump_quantize(
    x: torch.Tensor, fmt: str, *, block_size: int, axis: int, rounding: str
) -> torch.Tensor:
    """Fake-quantize ``x`` with the paper's exponent bump (scale_rule "paper_bump")."""
    blocks, restore = _to_blocks(x, block_size, axis)
    bad_block, exp, scaled, info = _bump_scaled(blocks, fmt)
    mag = _round_magnitude(scaled.abs(), info, rounding).clamp_max(info.max_normal)
    out = torch.copysign(mag * _pow2(exp), blocks)
    return restore(torch.where(bad_block, torch.nan, out))


def bump_clipped(x: torch.Tensor, fmt: str, *, block_size: int, axis: int) -> int:
    """Elements whose bumped-scale magnitude exceeds the format's max normal."""
    blocks, _ = _to_blocks(x, block_size, axis)
    bad_block, _, scaled, info = _bump_scaled(blocks, fmt)
    return int(((scaled.abs() > info.max_normal) & ~bad_block).sum())


def _bf16(x: torch.Tensor, spec: PrecisionSpec) -> torch.Tensor:
    return quantize(x, "bf16", rounding=spec.rounding)


class _PreRound(torch.autograd.Function):
    """bf16 rounding of a value; its gradient is rounded too when the backward is quantized."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, spec: PrecisionSpec) -> torch.Tensor:
        ctx.spec = spec
        return _bf16(x, spec)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (_bf16(grad, ctx.spec) if ctx.spec.quantize_backward else grad), None


class _GradRound(torch.autograd.Function):
    """Identity forward; bf16-rounds the incoming gradient (the paper's grad_out rounding)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, spec: PrecisionSpec) -> torch.Tensor:
        ctx.spec = spec
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _bf16(grad, ctx.spec), None


class _ValueOf(torch.autograd.Function):
    """Forward value of ``value``, gradient routed to ``graph`` (an FP32 computation)."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, graph: torch.Tensor) -> torch.Tensor:
        return value.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, grad


def linear(x, weight, bias, spec: PrecisionSpec, mx_linear) -> torch.Tensor:
    """The paper's MX Linear: bf16 pre-rounding around ``mx_linear`` (mx.layers' GEMMs).

    With the backward quantized, rounding x, W, b (and their gradients) and grad_out to bf16
    around the OCP MX Linear gives the paper's values bit for bit. Forward-only, the paper
    saves the unrounded x and W and runs the backward in FP32.
    """
    rx, rw = _PreRound.apply(x, spec), _PreRound.apply(weight, spec)
    rb = None if bias is None else _PreRound.apply(bias, spec)
    if spec.quantize_backward:
        return _GradRound.apply(mx_linear(rx, rw, rb, spec), spec)
    with torch.no_grad():
        value = mx_linear(rx, rw, rb, spec)
    return _ValueOf.apply(value, F.linear(x, weight, bias))


class _LayerNormFn(torch.autograd.Function):
    """LayerNorm op by op with bf16 rounding after each op (the paper's norm_utils)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, spec: PrecisionSpec, affine):
        full = spec.ln_internals == "bf16"

        def r(t):  # always-rounded ops
            return _bf16(t, spec)

        def rq(t):  # rounded only with bf16 internals (not on the paper's "no LN quant" path)
            return _bf16(t, spec) if full else t

        if full:
            x = r(x)
            w, b = affine(weight), affine(bias)
        else:
            w, b = weight, bias
        n = x.shape[-1]
        mean = rq(rq(x.sum(-1, keepdim=True)) / n)
        shift = rq(x - mean)
        var = rq(rq(rq(shift * shift).sum(-1, keepdim=True)) / n)
        vare = r(var + eps)
        inv = r(1.0 / r(torch.sqrt(vare)))
        x_norm = r(shift * inv)
        out = r(w * x_norm) if w is not None else x_norm
        out = r(out + b) if b is not None else r(out)
        ctx.spec, ctx.full, ctx.has_bias = spec, full, b is not None
        ctx.save_for_backward(x_norm, vare, w if spec.quantize_backward else weight)
        return out

    @staticmethod
    def backward(ctx, grad):
        spec: PrecisionSpec = ctx.spec
        x_norm, vare, weight = ctx.saved_tensors
        rounded = ctx.full and spec.quantize_backward

        def rq(t):
            return _bf16(t, spec) if rounded else t

        axes = list(range(grad.ndim - 1))
        n = grad.shape[-1]
        g = rq(grad)
        grad_w = rq(rq(g * x_norm).sum(axes)) if weight is not None else None
        grad_b = rq(g.sum(axes)) if ctx.has_bias and spec.ln_bias_grad else None
        dx_norm = rq(g * weight) if weight is not None else g
        std = rq(torch.sqrt(vare))
        dx_shift = rq(dx_norm * rq(1.0 / std))
        t = rq(rq(dx_norm * x_norm) * std)
        t = rq(rq(t.sum(-1, keepdim=True)) / n)
        t = rq(t * rq(1.0 / vare))
        dx = rq(dx_shift + rq(-t * x_norm))
        dx_mean = rq(rq(dx.sum(-1, keepdim=True)) / n)
        dx = rq(dx + -dx_mean)
        return dx, grad_w, grad_b, None, None, None


def layer_norm(x, weight, bias, eps: float, spec: PrecisionSpec, affine) -> torch.Tensor:
    """The paper's LayerNorm (``spec.ln_internals`` "bf16" or "bf16_tail"); ``affine`` maps
    a weight/bias parameter to the value used (bf16 or MX per ``spec.ln``), without grad."""
    return _LayerNormFn.apply(x, weight, bias, eps, spec, affine)
