"""Quantized drop-in modules and ``apply``/``remove`` to swap them into a live model.

The quantized modules subclass the plain ones and share their Parameter objects, so an
optimizer, ``state_dict`` keys and ``isinstance(m, nn.Linear)`` checks are unaffected.
No torch function is patched globally: only the modules of the given model change.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mx import paper, recipe
from mx.hadamard import transform_rows
from mx.nvfp4 import quantize_nvfp4
from mx.quantizer import clip_rate, quantize
from mx.spec import PrecisionSpec


def _round_elementwise(x: torch.Tensor, spec: PrecisionSpec) -> torch.Tensor:
    # Stochastic rounding is for GEMM operands; element-wise ops stay round-to-nearest.
    rounding = "even" if spec.rounding == "stochastic" else spec.rounding
    return quantize(x, spec.elementwise, rounding=rounding) if _bf16(spec) else x


def _bf16(spec: PrecisionSpec) -> bool:
    return spec.elementwise == "bf16"


class _RoundSTE(torch.autograd.Function):
    """Element-wise bf16 rounding of a value and of its gradient (the paper's non-GEMM ops)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, spec: PrecisionSpec) -> torch.Tensor:
        ctx.spec = spec
        return _round_elementwise(x, spec)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _round_elementwise(grad, ctx.spec), None


def _round_ste(x: torch.Tensor, spec: PrecisionSpec) -> torch.Tensor:
    return _RoundSTE.apply(x, spec) if _bf16(spec) else x


class _QuantizeSTE(torch.autograd.Function):
    """Fake-quantize in the forward pass, pass the gradient straight through."""

    @staticmethod
    def forward(
        ctx, x: torch.Tensor, fmt: str, spec: PrecisionSpec, aux: recipe.QuantAux | None
    ) -> torch.Tensor:
        return _quant(x, fmt, spec, axis=-1, aux=aux)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None, None


def _quant(
    x: torch.Tensor,
    fmt: str,
    spec: PrecisionSpec,
    axis: int,
    *,
    aux: recipe.QuantAux | None = None,
    grad: bool = False,
    weight: bool = False,
) -> torch.Tensor:
    """Quantize one GEMM operand: gradient operands use ``spec.bwd_rounding``, NVFP4
    weights the spec's weight block layout, stochastic rounding the model's noise."""
    rounding = spec.bwd_rounding if grad else spec.rounding
    generator = aux.generator(x.device) if aux is not None and rounding == "stochastic" else None
    if weight and fmt == "nvfp4" and x.ndim == 2:
        return quantize_nvfp4(
            x, axis=axis, layout=spec.nvfp4_weight_block, rounding=rounding, generator=generator
        )
    return quantize(
        x,
        fmt,
        block_size=spec.block_size,
        axis=axis,
        scale_rule=spec.scale_rule,
        rounding=rounding,
        generator=generator,
    )


def _rate(x: torch.Tensor, fmt: str, spec: PrecisionSpec) -> float:
    return clip_rate(x, fmt, block_size=spec.block_size, scale_rule=spec.scale_rule)


def gemm_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype a QuantLinear's three GEMMs compute and return in.

    Under autocast on ``x``'s device: autocast's dtype (bf16), as a GPU MX kernel does.
    Otherwise the wider of the input's and the weight's dtypes (fp32 + bf16 -> fp32).
    """
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(x.dtype, weight.dtype)


def _operand(
    t: torch.Tensor, fmt: str, spec: PrecisionSpec, axis: int, dtype: torch.dtype, **roles
) -> torch.Tensor:
    """A GEMM operand: ``t`` quantized from its own values (never pre-rounded to ``dtype``,
    so the MX values equal fp32 mode's for equal inputs), then cast to the GEMM dtype
    (exact for MX elements of <= 7 mantissa bits at normal scales)."""
    return _quant(t, fmt, spec, axis, **roles).to(dtype)


def _rounded_operand(t: torch.Tensor, spec: PrecisionSpec, dtype: torch.dtype) -> torch.Tensor:
    """A backward GEMM operand when the backward is not MX-quantized."""
    return _round_elementwise(t, spec).to(dtype)


class _MXLinearFn(torch.autograd.Function):
    """y = Q(x) Q(W)^T + b with all three GEMMs quantized along the paper's axes.

    Forward: x and W blocked along K (in_features). Weight gradient: grad_output and x
    blocked along the token axis. Input gradient: grad_output along out_features and W
    along out_features (dim 0). The unquantized x and W are saved and re-quantized in the
    backward formats; the rounding itself is straight-through.

    Inputs, weights and gradients may be any mix of fp32/bf16: each is quantized from its
    own values, the GEMMs run with autocast off in ``gemm_dtype`` (fixed at forward time,
    the backward uses the same), and gradients come back in their input's dtype.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, spec: PrecisionSpec, aux: recipe.QuantAux | None):
        dtype = gemm_dtype(x, weight)
        ctx.spec, ctx.aux, ctx.dtype = spec, aux, dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.save_for_backward(x, weight)
        with torch.autocast(x.device.type, enabled=False):
            y = F.linear(
                _operand(x, spec.a_fmt, spec, -1, dtype, aux=aux),
                _operand(weight, spec.w_fmt, spec, -1, dtype, aux=aux, weight=True),
            )
            y = _round_elementwise(y, spec)
            if bias is not None:
                y = _round_elementwise(y + bias.to(dtype), spec)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        spec: PrecisionSpec = ctx.spec
        dtype, aux = ctx.dtype, ctx.aux
        x, weight = ctx.saved_tensors
        g2d = grad_out.reshape(-1, grad_out.shape[-1])
        x2d = x.reshape(-1, x.shape[-1])
        if spec.quantize_backward:
            g_in = _operand(g2d, spec.grad_fmt, spec, -1, dtype, aux=aux, grad=True)
            w_in = _operand(weight, spec.bwd_w_fmt, spec, 0, dtype, aux=aux, weight=True)
            g_rows, x_rows = g2d, x2d
            if spec.hadamard_wgrad:
                # Orthogonal along the contracted token axis: dW is unchanged before rounding.
                block = aux.rht_block(g2d.device)
                g_rows, x_rows = transform_rows(g2d, block), transform_rows(x2d, block)
            g_w = _operand(g_rows, spec.grad_fmt, spec, 0, dtype, aux=aux, grad=True)
            x_w = _operand(x_rows, spec.bwd_a_fmt, spec, 0, dtype, aux=aux)
        else:
            g_in = g_w = _rounded_operand(g2d, spec, dtype)
            w_in = _rounded_operand(weight, spec, dtype)
            x_w = _rounded_operand(x2d, spec, dtype)
        grad_x = grad_w = grad_b = None
        with torch.autocast(x.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                grad_x = _round_elementwise(g_in @ w_in, spec).reshape(x.shape).to(x.dtype)
            if ctx.needs_input_grad[1]:
                grad_w = _round_elementwise(g_w.t() @ x_w, spec).to(weight.dtype)
            if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
                grad_b = g2d.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None


class QuantLinear(nn.Linear):
    """nn.Linear whose three GEMMs run in MX emulation per ``spec`` (built by ``apply``)."""

    spec: PrecisionSpec
    track_clips: bool
    clip_stats: dict[str, float]
    mx_aux: recipe.QuantAux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.track_clips:
            self.clip_stats = {
                "w": _rate(self.weight.detach(), self.spec.w_fmt, self.spec),
                "a": _rate(x.detach(), self.spec.a_fmt, self.spec),
            }
        if self.spec.pre_round == "bf16":
            return paper.linear(x, self.weight, self.bias, self.spec, self._mx_linear)
        return self._mx_linear(x, self.weight, self.bias, self.spec)

    def _mx_linear(self, x, weight, bias, spec: PrecisionSpec) -> torch.Tensor:
        return _MXLinearFn.apply(x, weight, bias, spec, self.mx_aux)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, spec={self.spec.label}"


class QuantLayerNorm(nn.LayerNorm):
    """LayerNorm with bf16 internals (``spec.elementwise``) and quantized affine params.

    ``spec.ln``: "mx" puts weight/bias in MX blocks of ``w_fmt``, "bf16" rounds them.
    """

    spec: PrecisionSpec
    track_clips: bool
    clip_stats: dict[str, float]

    def _affine(self, param: torch.Tensor | None) -> torch.Tensor | None:
        if param is None:
            return None
        if self.spec.ln == "mx":
            return _QuantizeSTE.apply(param, self.spec.w_fmt, self.spec, self.mx_aux)
        if self.spec.ln == "bf16":
            return _QuantizeSTE.apply(param, "bf16", self.spec, self.mx_aux)
        return param

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.track_clips and self.spec.ln == "mx" and self.weight is not None:
            self.clip_stats = {"w": _rate(self.weight.detach(), self.spec.w_fmt, self.spec)}
        if self.spec.ln_internals != "fp32":
            return paper.layer_norm(
                x, self.weight, self.bias, self.eps, self.spec, self._affine_value
            )
        bias = self._affine(self.bias)
        if bias is not None and not self.spec.ln_bias_grad:
            bias = bias.detach()  # the paper's LayerNorm returns no bias gradient
        x = _round_ste(x, self.spec)
        y = F.layer_norm(x, self.normalized_shape, self._affine(self.weight), bias, self.eps)
        return _round_ste(y, self.spec)

    def _affine_value(self, param: torch.Tensor | None) -> torch.Tensor | None:
        # The paper's LayerNorm computes its own gradients from the rounded values.
        with torch.no_grad():
            return self._affine(param)


class QuantGELU(nn.GELU):
    """GELU whose input, output and gradients are rounded to bf16 element-wise."""

    spec: PrecisionSpec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(_round_ste(x, self.spec), approximate=self.approximate)
        return _round_ste(y, self.spec)


_QUANT_OF = {nn.Linear: QuantLinear, nn.LayerNorm: QuantLayerNorm, nn.GELU: QuantGELU}
_PLAIN_OF = {quant: plain for plain, quant in _QUANT_OF.items()}


def _wanted(plain: type[nn.Module], spec: PrecisionSpec) -> bool:
    if plain is nn.Linear:
        return True
    if plain is nn.LayerNorm:
        return spec.ln != "none" or spec.ln_internals != "fp32" or not spec.ln_bias_grad
    return spec.quantize_gelu and _bf16(spec)


def _swap(module: nn.Module, cls: type[nn.Module]) -> nn.Module:
    """A module of class ``cls`` sharing ``module``'s parameters, buffers and attributes."""
    new = cls.__new__(cls)
    new.__dict__ = dict(module.__dict__)
    # Fresh containers so the old module stays usable and unaffected.
    for name in ("_parameters", "_buffers", "_modules"):
        new.__dict__[name] = dict(module.__dict__[name])
    for name in ("spec", "track_clips", "clip_stats", "mx_aux"):
        new.__dict__.pop(name, None)
    return new


def _replace_children(model: nn.Module, convert) -> nn.Module:
    """Replace every submodule m (and the root) by ``convert(m)`` when it returns one."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            new = convert(child)
            if new is not None:
                setattr(parent, name, new)
    root = convert(model)
    return model if root is None else root


def remove(model: nn.Module) -> nn.Module:
    """Restore plain nn.Linear/nn.LayerNorm/nn.GELU modules in place; returns the model."""

    def convert(module: nn.Module) -> nn.Module | None:
        plain = _PLAIN_OF.get(type(module))
        return None if plain is None else _swap(module, plain)

    return _replace_children(model, convert)


def apply(model: nn.Module, spec: PrecisionSpec, *, seed: int = 0) -> nn.Module:
    """Swap plain modules for quantized ones per ``spec``, in place; returns the model.

    A model that is already quantized is first restored, so re-applying with another
    spec mid-training works. Parameters are the same objects before and after. ``seed``
    seeds the stochastic-rounding stream and the Hadamard signs (``mx.recipe``); modules
    matching ``spec.keep_bf16`` get the spec with bf16 operands.
    """
    if not isinstance(spec, PrecisionSpec):
        raise ValueError(f"spec must be a PrecisionSpec, got {type(spec).__name__}")
    model = remove(model)
    if spec.is_noop:
        return model
    kept = recipe.kept_modules(model, spec.keep_bf16)
    kept_spec = recipe.bf16_spec(spec) if kept else spec
    aux = recipe.make_aux(spec, seed)

    def convert(module: nn.Module) -> nn.Module | None:
        plain = type(module)
        own = kept_spec if id(module) in kept else spec
        if plain not in _QUANT_OF or not _wanted(plain, own):
            return None
        new = _swap(module, _QUANT_OF[plain])
        new.spec = own
        new.track_clips = False
        new.clip_stats = {}
        new.mx_aux = aux
        return new

    return _replace_children(model, convert)


def set_clip_tracking(model: nn.Module, on: bool) -> None:
    """Turn per-layer clip-rate recording on or off for every quantized module of ``model``."""
    for module in model.modules():
        if isinstance(module, QuantLinear | QuantLayerNorm):
            module.track_clips = on
            if not on:
                module.clip_stats = {}


def clip_rates(model: nn.Module) -> dict[str, float]:
    """Clip rates recorded on the last tracked forward: {"<module path>/w" | "/a": rate}."""
    rates: dict[str, float] = {}
    for path, module in model.named_modules():
        for role, rate in getattr(module, "clip_stats", {}).items():
            rates[f"{path}/{role}"] = rate
    return rates
