"""Quantized layers: GEMM roles and axes, apply/remove on a live model, clip tracking."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mx
from mx.layers import QuantGELU, QuantLayerNorm, QuantLinear

E4M3 = mx.PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3")


class Block(nn.Module):
    """A pre-LN residual MLP block like the LM's and the proxy's."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d, bias=False)
        self.fc1 = nn.Linear(d, 4 * d, bias=False)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(Block(), Block())


def inputs(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 48, 64, generator=torch.Generator().manual_seed(seed))


def q(x, fmt, spec, axis):
    return mx.quantize(
        x,
        fmt,
        block_size=spec.block_size,
        axis=axis,
        scale_rule=spec.scale_rule,
        rounding=spec.rounding,
    )


def test_linear_quantizes_all_three_gemms_on_the_paper_axes():
    spec = mx.PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp6_e2m3", grad_fmt="fp8_e5m2")
    torch.manual_seed(0)
    lin = mx.apply(nn.Linear(64, 96), spec)
    x = inputs().requires_grad_()
    g = torch.randn(2, 48, 96)
    lin(x).backward(g)

    with torch.no_grad():
        y = F.linear(q(x, "fp6_e2m3", spec, -1), q(lin.weight, "fp8_e4m3", spec, -1), lin.bias)
        g2, x2 = g.reshape(-1, 96), x.reshape(-1, 64)
        grad_x = q(g2, "fp8_e5m2", spec, -1) @ q(lin.weight, "fp8_e4m3", spec, 0)
        grad_w = q(g2, "fp8_e5m2", spec, 0).t() @ q(x2, "fp6_e2m3", spec, 0)
        wrong_axis = q(g2, "fp8_e5m2", spec, -1).t() @ q(x2, "fp6_e2m3", spec, -1)
    assert torch.equal(lin(x), y)
    assert torch.equal(x.grad, grad_x.reshape(x.shape))
    assert torch.equal(lin.weight.grad, grad_w)
    assert not torch.equal(lin.weight.grad, wrong_axis)
    assert torch.equal(lin.bias.grad, g2.sum(0))


def test_forward_only_mx_leaves_backward_exact():
    spec = mx.PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3", quantize_backward=False)
    torch.manual_seed(0)
    lin = mx.apply(nn.Linear(64, 32, bias=False), spec)
    x = inputs().requires_grad_()
    g = torch.randn(2, 48, 32)
    lin(x).backward(g)
    assert torch.equal(x.grad, g @ lin.weight.detach())
    assert torch.allclose(lin.weight.grad, g.reshape(-1, 32).t() @ x.detach().reshape(-1, 64))


def test_bf16_baseline_rounds_operands_and_output():
    spec = mx.PrecisionSpec(w_fmt="bf16", a_fmt="bf16", elementwise="bf16", rounding="even")
    torch.manual_seed(0)
    lin = mx.apply(nn.Linear(64, 32, bias=False), spec)
    x = inputs()
    want = F.linear(x.bfloat16().float(), lin.weight.bfloat16().float()).bfloat16().float()
    assert torch.equal(lin(x), want)
    assert not torch.equal(lin(x), F.linear(x, lin.weight))


def test_apply_keeps_parameters_state_dict_and_optimizer():
    model = make_model()
    params = list(model.parameters())
    keys = list(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mx.apply(model, E4M3)
    assert isinstance(model[0].fc1, QuantLinear) and isinstance(model[0].fc1, nn.Linear)
    assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
    assert list(model.state_dict()) == keys
    before = model[0].fc1.weight.detach().clone()
    model(inputs()).square().mean().backward()
    opt.step()
    assert not torch.equal(model[0].fc1.weight, before)


def test_remove_restores_plain_modules_and_exact_fp32_output():
    model = make_model()
    x = inputs()
    want = model(x)
    mx.apply(model, E4M3.model_copy(update={"ln": "mx", "elementwise": "bf16"}))
    assert not torch.equal(model(x), want)
    mx.remove(model)
    types = {type(m) for m in model.modules()}
    assert types == {nn.Sequential, Block, nn.LayerNorm, nn.Linear, nn.GELU}
    assert torch.equal(model(x), want)


def test_noop_spec_changes_nothing():
    model = make_model()
    fc1 = model[0].fc1
    assert mx.apply(model, mx.PrecisionSpec()) is model
    assert model[0].fc1 is fc1 and type(fc1) is nn.Linear


def test_reapply_switches_spec_mid_training():
    model = make_model()
    mx.apply(model, E4M3.model_copy(update={"elementwise": "bf16", "ln": "bf16"}))
    assert isinstance(model[0].ln, QuantLayerNorm) and isinstance(model[0].act, QuantGELU)
    model(inputs()).sum().backward()
    mx.apply(model, E4M3.model_copy(update={"quantize_gelu": False}))
    assert type(model[0].ln) is nn.LayerNorm and type(model[0].act) is nn.GELU
    assert model[0].fc1.spec.ln == "none"


def test_ln_affine_quantization_modes():
    torch.manual_seed(0)
    ln = nn.LayerNorm(64, bias=False)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
    x = inputs()
    for mode, fmt in [("mx", "fp4_e2m1"), ("bf16", "bf16")]:
        qln = mx.apply(ln, mx.PrecisionSpec(w_fmt="fp4_e2m1", a_fmt="bf16", ln=mode))
        weight = q(ln.weight.detach(), fmt, qln.spec, -1)
        assert torch.equal(qln(x), F.layer_norm(x, (64,), weight))
        qln(x).sum().backward()  # straight-through: gradient reaches the raw weight
        assert ln.weight.grad is not None and ln.weight.grad.abs().sum() > 0


def test_clip_tracking_records_rates_per_layer():
    model = mx.apply(make_model(), E4M3.model_copy(update={"ln": "mx"}))
    x = inputs()
    model(x)
    assert mx.clip_rates(model) == {}
    mx.set_clip_tracking(model, True)
    model(x)
    rates = mx.clip_rates(model)
    assert set(rates) == {
        f"{i}.{n}/{r}"
        for i in (0, 1)
        for n, r in [("fc1", "w"), ("fc1", "a"), ("fc2", "w"), ("fc2", "a"), ("ln", "w")]
    }
    assert rates["0.fc1/w"] == mx.clip_rate(model[0].fc1.weight.detach(), "fp8_e4m3")
    assert rates["0.fc1/a"] == mx.clip_rate(model[0].ln(x).detach(), "fp8_e4m3")
    assert 0.0 < rates["0.fc1/a"] < 0.05
    mx.set_clip_tracking(model, False)
    assert mx.clip_rates(model) == {}


def test_apply_rejects_non_spec():
    with pytest.raises(ValueError, match="PrecisionSpec"):
        mx.apply(make_model(), {"w_fmt": "fp8_e4m3"})
