"""The dtype policy: MX layers under bf16 autocast and bf16 weights, train.autocast and
train.param_dtype resolved and recorded, FP32 references that never autocast."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mx
from models.config import Branch, LMConfig, ProxyConfig, RunSpec, SyntheticData, TrainConfig
from models.dtypes import resolve_autocast, resolve_param_dtype
from models.runner import train_run
from models.train import Trainer
from models.transformer import TransformerLM
from mx.arms import ARMS, apply_arm
from mx.layers import gemm_dtype

E4M3 = mx.PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3", elementwise="bf16")
LM = LMConfig(d_model=32, n_layers=1, head_dim=16, vocab_size=64, seq_len=16)
AUTOCAST = {"device_type": "cpu", "dtype": torch.bfloat16}


def q(x: torch.Tensor, fmt: str, axis: int) -> torch.Tensor:
    return mx.quantize(x, fmt, axis=axis, rounding=E4M3.rounding)


@pytest.mark.parametrize("arm", sorted(ARMS))
@pytest.mark.parametrize("ln", ["bf16", "mx", "none"])
def test_mx_transformer_trains_under_bf16_autocast_for_every_ln_mode_and_arm(ln, arm):
    # The paper's arms act on the paper's ops, so they run under its profile.
    profile = "paper" if arm.startswith("paper_") else "ocp"
    base = mx.PrecisionSpec(
        w_fmt="fp8_e4m3", a_fmt="fp8_e4m3", elementwise="bf16", ln=ln, profile=profile
    )
    spec = apply_arm(arm, base)
    torch.manual_seed(0)
    model = mx.apply(TransformerLM(LM), spec)
    tokens = torch.randint(0, LM.vocab_size, (2, LM.seq_len + 1))
    with torch.autocast(**AUTOCAST):
        loss = model.loss(tokens)
    loss.backward()
    assert math.isfinite(loss.item())
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.dtype == torch.float32, name
        assert torch.isfinite(param.grad).all(), name


def test_gemms_under_autocast_use_the_fp32_mode_quantized_values():
    torch.manual_seed(0)
    lin = mx.apply(nn.Linear(64, 96), E4M3)
    x = torch.randn(2, 8, 64, requires_grad=True)
    g = torch.randn(2, 8, 96).bfloat16()
    with torch.autocast(**AUTOCAST):
        assert gemm_dtype(x, lin.weight) == torch.bfloat16
        y = lin(x)
    y.backward(g)
    assert y.dtype == torch.bfloat16 and x.grad.dtype == lin.weight.grad.dtype == torch.float32
    w = lin.weight.detach()
    with torch.no_grad():
        # Quantized from the fp32 values (no pre-rounding to bf16), exact in bf16.
        qx, qw = q(x, "fp8_e4m3", -1), q(w, "fp8_e4m3", -1)
        assert torch.equal(qx.bfloat16().float(), qx) and torch.equal(qw.bfloat16().float(), qw)
        expected = F.linear(qx.bfloat16(), qw.bfloat16()) + lin.bias.bfloat16()
        g2, x2 = g.reshape(-1, 96).float(), x.detach().reshape(-1, 64)
        grad_w = q(g2, "fp8_e4m3", 0).bfloat16().t() @ q(x2, "fp8_e4m3", 0).bfloat16()
        grad_x = q(g2, "fp8_e4m3", -1).bfloat16() @ q(w, "fp8_e4m3", 0).bfloat16()
    assert torch.equal(y, expected)
    assert torch.equal(lin.weight.grad, grad_w.float())
    assert torch.equal(x.grad, grad_x.float().reshape(x.shape))
    assert torch.equal(lin.bias.grad, g2.sum(0))


def test_bf16_weight_with_fp32_input_computes_in_fp32_on_the_same_quantized_values():
    torch.manual_seed(0)
    lin = mx.apply(nn.Linear(64, 32, bias=False), E4M3)
    lin.weight.data = lin.weight.data.bfloat16()
    x = torch.randn(4, 64, requires_grad=True)
    y = lin(x)
    y.sum().backward()
    w32 = lin.weight.detach().float()
    assert y.dtype == torch.float32 and lin.weight.grad.dtype == torch.bfloat16
    assert x.grad.dtype == torch.float32
    assert torch.equal(q(lin.weight.detach(), "fp8_e4m3", -1).float(), q(w32, "fp8_e4m3", -1))
    with torch.no_grad():
        expected = mx.quantize(
            F.linear(q(x, "fp8_e4m3", -1), q(w32, "fp8_e4m3", -1)), "bf16", rounding="half_away"
        )
    assert torch.equal(y, expected)


def spec_of(model=LM, precision=E4M3, **train) -> RunSpec:
    settings = dict(steps=6, batch_size=8, lr=3e-3, log_every=1, stats_every=3)
    # The proxy makes its own data; the LM reads a small Markov source.
    data = SyntheticData(order=1, branching=4) if model.kind == "lm" else SyntheticData()
    return RunSpec(
        model=model, data=data, train=TrainConfig(**{**settings, **train}), precision=precision
    )


def test_autocast_policy_resolution():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    proxy = ProxyConfig(width=32, depth=1)
    assert resolve_autocast(spec_of(), cuda) == "bf16"
    assert resolve_autocast(spec_of(), cpu) == "none"
    assert resolve_autocast(spec_of(model=proxy), cuda) == "none"
    assert resolve_autocast(spec_of(autocast="bf16"), cpu) == "bf16"
    assert resolve_autocast(spec_of(autocast="none"), cuda) == "none"
    branch = Branch(parent="abc", step=3, arm="full_precision")
    fp32_arm = spec_of(autocast="bf16", param_dtype="bf16").model_copy(update={"branch": branch})
    assert resolve_autocast(fp32_arm, cuda) == "none"
    assert resolve_param_dtype(fp32_arm) == "fp32"
    assert resolve_param_dtype(spec_of(param_dtype="bf16")) == "bf16"


def test_dtype_fields_keep_run_ids_at_their_defaults():
    plain = spec_of()
    assert spec_of(autocast="auto", param_dtype="fp32").run_id == plain.run_id
    ids = {plain.run_id, spec_of(autocast="bf16").run_id, spec_of(param_dtype="bf16").run_id}
    assert len(ids) == 3


def test_bf16_params_keep_fp32_master_weights_and_change_the_numerics(tmp_path):
    losses = {}
    for dtype in ("fp32", "bf16"):
        trainer = Trainer(spec_of(param_dtype=dtype, autocast="bf16"), tmp_path / dtype, None)
        loss, _ = trainer.train_step(stats=False)
        losses[dtype] = loss.item()
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
        states = trainer.main.optimizer.state.values()
        assert all(s["exp_avg"].dtype == torch.float32 for s in states)
        assert trainer.summary()["param_dtype"] == dtype
        assert trainer.summary()["autocast"] == "bf16"
    assert losses["fp32"] != losses["bf16"]
    assert losses["fp32"] == pytest.approx(losses["bf16"], rel=1e-2)


def metric(run_dir, name: str) -> list[float]:
    table = pq.read_table(run_dir / "metrics").to_pandas()
    rows = table[table["name"].astype(str) == name].sort_values("step")
    return rows["value"].tolist()


def test_paired_twin_equals_a_plain_fp32_run_bit_for_bit_with_autocast_on(tmp_path):
    proxy = ProxyConfig(width=32, depth=2, paired=True)
    mx_spec = spec_of(model=proxy, autocast="bf16", param_dtype="bf16", steps=8)
    plain = RunSpec.model_validate(
        {
            **mx_spec.model_dump(),
            "model": ProxyConfig(width=32, depth=2).model_dump(),
            "precision": mx.PrecisionSpec().model_dump(),
            "train": {**mx_spec.train.model_dump(), "autocast": "none", "param_dtype": "fp32"},
        }
    )
    summary = train_run(mx_spec, tmp_path / "mx")
    train_run(plain, tmp_path / "plain")
    assert summary["autocast"] == "bf16" and summary["param_dtype"] == "bf16"
    twin = metric(tmp_path / "mx", "paired/fp32_loss")
    fp32 = metric(tmp_path / "plain", "train/loss")
    assert len(twin) == 8 and twin == fp32
    assert metric(tmp_path / "mx", "train/loss") != fp32
