"""Recipe pieces in layers: per-role rounding, NVFP4 weights, Hadamard wgrad, keep_bf16, ids."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mx
from models.config import LMConfig, RunSpec
from models.transformer import TransformerLM
from mx.hadamard import hadamard_matrix, rht_matrix, transform_rows
from mx.layers import QuantLinear


def _grads(spec: mx.PrecisionSpec, seed: int = 0, x_seed: int = 1):
    torch.manual_seed(0)
    lin = mx.apply(nn.Linear(64, 32, bias=False), spec, seed=seed)
    x = torch.randn(4, 48, 64, generator=torch.Generator().manual_seed(x_seed))
    x.requires_grad_()
    y = lin(x)
    y.backward(torch.randn(4, 48, 32, generator=torch.Generator().manual_seed(2)))
    return y.detach(), x.grad, lin.weight.grad


def test_grad_rounding_is_stochastic_only_for_gradient_operands():
    rne = mx.PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3", rounding="even")
    sr = rne.model_copy(update={"grad_rounding": "stochastic"})
    sr = mx.PrecisionSpec.model_validate(sr.model_dump())
    y_rne, gx_rne, gw_rne = _grads(rne)
    y_sr, gx_sr, gw_sr = _grads(sr)
    assert torch.equal(y_rne, y_sr)  # forward operands are round-to-nearest in both
    assert not torch.equal(gx_rne, gx_sr) and not torch.equal(gw_rne, gw_sr)
    # Same seed, same bits; another seed, another stream.
    assert torch.equal(_grads(sr)[2], gw_sr)
    assert not torch.equal(_grads(sr, seed=1)[2], gw_sr)
    assert sr.bwd_rounding == "stochastic" and rne.bwd_rounding == "even"
    assert sr.label == "fp8_e4m3_fp8_e4m3_sr_grad"


def test_sr_gradients_are_unbiased_where_rne_is_not():
    # Mean of many SR weight gradients converges to the fp32-operand GEMM; RNE's doesn't.
    # RCEIL scales never clamp a block max, so every gradient lies in the representable range.
    spec = mx.PrecisionSpec(
        w_fmt="fp32", a_fmt="fp32", grad_fmt="fp4_e2m1", rounding="even", scale_rule="rceil"
    )
    sr = mx.PrecisionSpec.model_validate({**spec.model_dump(), "grad_rounding": "stochastic"})
    exact = _grads(mx.PrecisionSpec(w_fmt="fp32", a_fmt="bf16", bwd_a_fmt="fp32"))[2]
    ref_err = (_grads(spec)[2] - exact).norm()
    mean_sr = torch.stack([_grads(sr, seed=s)[2] for s in range(64)]).mean(0)
    assert (mean_sr - exact).norm() < 0.3 * ref_err


def test_nvfp4_weights_use_16x16_tiles_in_both_gemms():
    spec = mx.PrecisionSpec(w_fmt="nvfp4", a_fmt="nvfp4")
    torch.manual_seed(0)
    lin = mx.apply(nn.Linear(64, 32, bias=False), spec)
    x = torch.randn(8, 64)
    y = lin(x)
    from mx.nvfp4 import quantize_nvfp4

    w_q = quantize_nvfp4(lin.weight.detach(), layout="16x16")
    assert torch.equal(y.detach(), F.linear(mx.quantize(x, "nvfp4"), w_q))
    one_d = mx.PrecisionSpec(w_fmt="nvfp4", a_fmt="nvfp4", nvfp4_weight_block="1x16")
    assert one_d.label == "nvfp4_nvfp4_w1x16" and spec.label == "nvfp4_nvfp4"


def test_hadamard_block_is_orthogonal_and_keeps_the_gemm():
    h = rht_matrix(3)
    assert torch.allclose(h @ h.t(), torch.eye(16), atol=1e-6)
    assert set(hadamard_matrix().abs().unique().tolist()) == {1.0}
    assert not torch.equal(rht_matrix(3), rht_matrix(4))  # the signs come from the seed
    g, x = torch.randn(50, 8, dtype=torch.float64), torch.randn(50, 12, dtype=torch.float64)
    hd = h.double()
    assert torch.allclose(transform_rows(g, hd).t() @ transform_rows(x, hd), g.t() @ x)
    # In the layer without quantization: the weight gradient is unchanged (to fp32 error).
    fp32 = mx.PrecisionSpec(w_fmt="fp32", a_fmt="bf16", bwd_a_fmt="fp32", grad_fmt="fp32")
    rht = mx.PrecisionSpec.model_validate({**fp32.model_dump(), "hadamard_wgrad": True})
    plain, rotated = _grads(fp32)[2], _grads(rht)[2]
    assert not torch.equal(plain, rotated) and torch.allclose(plain, rotated, atol=1e-5)
    assert rht.label.endswith("_rht")


def _spread(rows: torch.Tensor) -> float:
    blocks = rows.reshape(-1, 16, rows.shape[1])
    ratio = blocks.abs().amax(1) / blocks.pow(2).mean(1).sqrt()
    return ratio.mean().item()


def test_hadamard_reduces_block_amax_over_rms():
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(256, 32, generator=gen)
    g[torch.rand(256, 32, generator=gen) < 0.02] *= 30  # sparse outliers, as in gradients
    rotated = transform_rows(g, rht_matrix(0))
    assert _spread(rotated) < 0.8 * _spread(g)  # measured 1.94 vs 2.56
    # A lone spike in a block (amax/rms = 4, the worst case) is spread flat (ratio 1).
    spike = torch.zeros(16, 1)
    spike[5] = 7.0
    assert _spread(spike) == pytest.approx(4.0)
    assert _spread(transform_rows(spike, rht_matrix(0))) == pytest.approx(1.0)
    # ... which lowers the MXFP4 quantization error of the weight-gradient GEMM.
    x = torch.randn(256, 16, generator=gen)
    exact = g.t() @ x
    err = mx.quantize(g, "fp4_e2m1", axis=0).t() @ mx.quantize(x, "fp4_e2m1", axis=0) - exact
    h = rht_matrix(0)
    gq = mx.quantize(transform_rows(g, h), "fp4_e2m1", axis=0)
    err_rht = gq.t() @ mx.quantize(transform_rows(x, h), "fp4_e2m1", axis=0) - exact
    assert err_rht.norm() < err.norm()


def test_keep_bf16_globs_on_module_names():
    model = TransformerLM(LMConfig(d_model=32, head_dim=16, n_layers=3, vocab_size=64, seq_len=8))
    spec = mx.PrecisionSpec(
        w_fmt="fp8_e4m3", a_fmt="fp8_e4m3", ln="mx", keep_bf16=("head", "blocks.-1")
    )
    mx.apply(model, spec)
    specs = {n: m.spec for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    kept = {n for n, s in specs.items() if s.w_fmt == "bf16"}
    assert kept == {
        "head",
        "blocks.2.attn.qkv",
        "blocks.2.attn.out",
        "blocks.2.mlp.fc1",
        "blocks.2.mlp.fc2",
    }
    assert {s.grad_fmt for n, s in specs.items() if n in kept} == {"bf16"}
    assert model.blocks[2].attn_norm.spec.ln == "bf16"
    assert model.blocks[0].attn_norm.spec.ln == "mx"
    assert spec.label == "fp8_e4m3_fp8_e4m3_keep_bf16_2"
    first = mx.PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3", keep_bf16=("blocks.0.mlp.*",))
    mx.apply(model, first)
    assert model.blocks[0].mlp.fc1.spec.w_fmt == "bf16"
    assert model.blocks[0].attn.qkv.spec.w_fmt == model.head.spec.w_fmt == "fp8_e4m3"
    with pytest.raises(ValueError, match=r"keep_bf16.*lm_head"):
        mx.apply(model, spec.model_copy(update={"keep_bf16": ("lm_head",)}))


def test_new_fields_at_defaults_keep_run_ids():
    spec = RunSpec.model_validate(
        {
            "model": {"d_model": 64, "vocab_size": 256, "seq_len": 64},
            "train": {"steps": 20, "batch_size": 16},
            "precision": {
                "w_fmt": "fp8_e4m3",
                "a_fmt": "fp8_e4m3",
                "elementwise": "bf16",
                "ln": "bf16",
                "rounding": "half_away",
            },
        }
    )
    assert spec.run_id == "36d4e51569b5"  # the id before grad_rounding & co. existed
    assert spec.precision.label == "fp8_e4m3_fp8_e4m3"
    changed = spec.model_copy(
        update={"precision": spec.precision.model_copy(update={"grad_rounding": "stochastic"})}
    )
    assert changed.run_id != spec.run_id


@pytest.mark.parametrize(
    "fields",
    [
        {"w_fmt": "nvfp4", "a_fmt": "nvfp4", "grad_rounding": "stochastic"},
        {"w_fmt": "nvfp4", "a_fmt": "bf16", "rounding": "stochastic", "hadamard_wgrad": True},
        {"w_fmt": "nvfp4", "a_fmt": "nvfp4", "nvfp4_weight_block": "1x16", "keep_bf16": ["h"]},
        {"w_fmt": "fp8_e4m3", "a_fmt": "fp8_e4m3", "block_size": 16},
    ],
)
def test_analysis_label_mirrors_the_spec_label(fields):
    from runfolder.label import precision_label

    assert precision_label(fields) == mx.PrecisionSpec(**fields).label
