"""The paper's own ops (mx.paper, precision.profile: paper) against its code, bit for bit.

tests/data/paper_ops/fixtures.pt holds inputs and outputs of the paper's pure-PyTorch MX
emulator (olmo/mx of Hither1/systems-scaling) run on CPU; make_fixtures.py beside it
regenerates them. Each test would fail for the OCP behaviour the option replaces.
"""

from pathlib import Path

import pytest
import torch
from torch import nn

import mx
from mx.arms import PAPER_ARMS, apply_arm
from mx.spec import PrecisionSpec

FIX = torch.load(Path(__file__).parent / "data" / "paper_ops" / "fixtures.pt")
MX = {"w_fmt": "fp8_e4m3", "a_fmt": "fp8_e4m3", "elementwise": "bf16", "ln": "bf16"}
PAPER = PrecisionSpec(profile="paper", **MX)
OCP = PrecisionSpec(**MX)


def _linear(spec: PrecisionSpec, name: str) -> dict[str, torch.Tensor]:
    lin = nn.Linear(64, 48)
    with torch.no_grad():
        lin.weight.copy_(FIX["w"])
        lin.bias.copy_(FIX["b"])
    lin = mx.apply(lin, spec)
    two_d = name == "bump"  # the paper ran its bump in the (2-D) proxy
    x = FIX["x"].reshape(-1, 64) if two_d else FIX["x"]
    x = x.clone().requires_grad_()
    y = lin(x)
    y.backward(FIX["gy"].reshape(*x.shape[:-1], 48))
    return {"y": y.detach(), "gx": x.grad, "gw": lin.weight.grad, "gb": lin.bias.grad}


def _layer_norm(spec: PrecisionSpec) -> tuple[dict[str, torch.Tensor], nn.Module]:
    ln = nn.LayerNorm(64)
    with torch.no_grad():
        ln.weight.copy_(FIX["ln_w"])
        ln.bias.copy_(FIX["ln_b"])
    ln = mx.apply(ln, spec)
    x = FIX["ln_x"].clone().requires_grad_()
    y = ln(x)
    y.backward(FIX["ln_gy"])
    return {"y": y.detach(), "gx": x.grad, "gw": ln.weight.grad}, ln


def test_profile_fills_the_paper_rows_and_explicit_fields_win():
    assert (PAPER.pre_round, PAPER.ln_bias_grad, PAPER.ln_internals) == ("bf16", False, "bf16")
    assert (OCP.pre_round, OCP.ln_bias_grad, OCP.ln_internals) == ("none", True, "fp32")
    mixed = PrecisionSpec(profile="paper", ln_bias_grad=True, **MX)
    assert mixed.ln_bias_grad and mixed.pre_round == "bf16"
    assert not PrecisionSpec(ln_bias_grad=False).is_noop and PrecisionSpec().is_noop


@pytest.mark.parametrize("axis", [-1, 0])
def test_paper_bump_is_bit_exact(axis):
    ours = mx.quantize(FIX["bump"], "fp8_e4m3", axis=axis, scale_rule="paper_bump",
                       rounding="half_away")  # fmt: skip
    assert torch.equal(ours, FIX[f"bump_out_axis{axis}"])
    # It is not the per-block RCEIL rule (what the authors described).
    rceil = mx.quantize(FIX["bump"], "fp8_e4m3", axis=axis, scale_rule="rceil",
                        rounding="half_away")  # fmt: skip
    assert not torch.equal(rceil, ours)


def test_paper_bump_refuses_other_formats():
    with pytest.raises(ValueError, match="only supports fp8_e4m3; got format 'fp8_e5m2'"):
        mx.quantize(torch.ones(32), "fp8_e5m2", scale_rule="paper_bump")
    with pytest.raises(ValueError, match="E4M3-only exponent bump; got MX format 'fp4_e2m1'"):
        PrecisionSpec(w_fmt="fp4_e2m1", a_fmt="fp8_e4m3", scale_rule="paper_bump")
    assert mx.clip_rate(FIX["bump"], "fp8_e4m3", scale_rule="paper_bump") <= mx.clip_rate(
        FIX["bump"], "fp8_e4m3"
    )


@pytest.mark.parametrize(
    "name, arm",
    [
        ("mx", "control"),
        ("bf16_act", "paper_bf16_act_fwd"),
        ("bf16_weight", "paper_bf16_weights"),
        ("no_bp_quant", "paper_no_bwd_quant"),
        ("bump", "paper_bump"),
    ],
)
def test_paper_linear_and_its_arms_are_bit_exact(name, arm):
    got = _linear(apply_arm(arm, PAPER), name)
    for key, value in got.items():
        assert torch.equal(value, FIX[f"lin_{name}_{key}"]), key


def test_ocp_linear_differs_from_the_papers():
    got = _linear(OCP, "mx")
    for key in ("y", "gx", "gw"):
        assert (got[key] == FIX[f"lin_mx_{key}"]).float().mean() < 0.5, key


@pytest.mark.parametrize(
    "name, arm",
    [("bf16", "control"), ("noq", "paper_no_ln_quant"), ("no_bp_quant", "paper_no_bwd_quant")],
)
def test_paper_layer_norm_is_bit_exact_and_has_no_bias_gradient(name, arm):
    got, ln = _layer_norm(apply_arm(arm, PAPER))
    for key, value in got.items():
        assert torch.equal(value, FIX[f"ln_{name}_{key}"]), key
    assert ln.bias.grad is None


def test_ocp_layer_norm_rounds_only_its_boundaries_and_trains_its_bias():
    got, ln = _layer_norm(OCP)
    assert ln.bias.grad is not None and ln.bias.grad.abs().sum() > 0
    assert not torch.equal(got["y"], FIX["ln_bf16_y"])
    assert not torch.equal(got["gx"], FIX["ln_bf16_gx"])
    # the bias gradient can be turned back on in the paper's LN, and off in FP32
    _, paper_ln = _layer_norm(PrecisionSpec(profile="paper", ln_bias_grad=True, **MX))
    assert paper_ln.bias.grad is not None
    _, frozen = _layer_norm(PrecisionSpec(ln_bias_grad=False))
    assert frozen.bias.grad is None and frozen.weight.grad is not None


def test_paper_arms_preset_and_fp32_backward_needs_the_papers_ops():
    from sweep.intervene import parse_arms

    assert parse_arms("paper") == list(PAPER_ARMS)
    assert not any(a.startswith("paper_") for a in parse_arms("all"))
    with pytest.raises(ValueError, match="needs the paper's ops"):
        apply_arm("paper_no_bwd_quant", OCP)
