"""The proxy workload: shapes and counts, deterministic data, paired FP32/MX training."""

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from pydantic import ValidationError

from models.config import ProxyConfig, RunSpec
from models.paired import gradient_bias
from models.proxy import Student, TeacherData
from models.runner import train_run
from models.train import lr_at
from models.transformer import count_params
from mx.arms import ARMS, apply_arm
from mx.spec import PrecisionSpec

MX = {"w_fmt": "fp8_e4m3", "a_fmt": "fp8_e4m3", "elementwise": "bf16", "ln": "bf16"}
TRAIN = {
    "steps": 30,
    "batch_size": 64,
    "lr": 1e-3,
    "schedule": "constant",
    "warmup_frac": 0,
    "beta2": 0.999,
    "eps": 1e-8,
    "grad_clip": 0,
    "log_every": 1,
    "stats_every": 10,
    "eval_every": 15,
    "eval_batches": 2,
}


def _spec(paired: bool, precision: dict, **model) -> RunSpec:
    return RunSpec.model_validate(
        {
            "model": {"kind": "proxy", "depth": 2, "width": 32, "paired": paired, **model},
            "train": TRAIN,
            "precision": precision,
        }
    )


def _wide(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / "metrics")
    return frame.pivot_table(index="step", columns="name", values="value", dropna=False)


@pytest.mark.parametrize("activation", ["gelu", "relu", "swiglu", "linear"])
@pytest.mark.parametrize("layernorm", [True, False])
def test_param_count_matches_the_module(activation, layernorm):
    cfg = ProxyConfig(depth=3, width=16, activation=activation, layernorm=layernorm)
    student = Student(cfg)
    assert count_params(student) == cfg.param_count()
    # 3 blocks of fc1 (16x64, x2 for SwiGLU's gate) + fc2 (64x16 + 16) + LN (2x16).
    fc1 = 16 * 64 * (2 if activation == "swiglu" else 1)
    assert cfg.param_count() == 3 * (fc1 + 64 * 16 + 16 + (32 if layernorm else 0))
    out = student(torch.randn(5, 16))
    assert out.shape == (5, 16)


def test_teacher_data_is_a_pure_function_of_seed_and_step():
    cfg = ProxyConfig(depth=2, width=16, noise_std=0.1)
    a = TeacherData(cfg, batch_size=8, eval_batches=2, seed=3, device="cpu")
    b = TeacherData(cfg, batch_size=8, eval_batches=2, seed=3, device="cpu")
    x1, y1 = a.train_batch(5)
    x2, y2 = b.train_batch(5)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(a.train_batch(6)[0], x1)
    assert not torch.equal(a.val_batches()[0][0], a.train_batch(0)[0])
    # Targets are the frozen teacher's output plus noise of the configured size.
    residual = y1 - a.teacher(x1)
    assert 0.05 < residual.std().item() < 0.2
    assert not any(p.requires_grad for p in a.teacher.parameters())
    scaled = TeacherData(
        ProxyConfig(depth=2, width=16, teacher_init_scale=10.0, noise_std=0.0),
        batch_size=256,
        eval_batches=1,
        seed=3,
        device="cpu",
    )
    x, y = scaled.train_batch(0)
    # Two layers of x10 weights and biases: the output grows far beyond the default's.
    assert y.var().item() > 100 * a.teacher(x).var().item()


def test_proxy_spec_rejects_a_data_section():
    with pytest.raises(ValidationError, match="proxy runs generate their own data"):
        RunSpec.model_validate(
            {"model": {"kind": "proxy"}, "data": {"kind": "synthetic", "order": 2}, "train": TRAIN}
        )


def test_lm_specs_without_kind_keep_their_ids():
    # A spec as grids wrote it before the proxy existed; its id was handed out then.
    spec = RunSpec.model_validate(
        {
            "model": {
                "d_model": 32,
                "n_layers": 1,
                "head_dim": 32,
                "vocab_size": 256,
                "seq_len": 64,
            },
            "train": {"steps": 20, "batch_size": 16, "lr": 3e-3},
        }
    )
    assert spec.model.kind == "lm"
    assert spec.run_id == "c99a73476b4a"


def test_constant_schedule_keeps_the_lr_after_warmup():
    cfg = RunSpec.model_validate(
        {"model": {"kind": "proxy"}, "train": {**TRAIN, "steps": 100, "warmup_frac": 0.1}}
    ).train
    assert lr_at(5, cfg) < 1e-3
    assert lr_at(10, cfg) == lr_at(99, cfg) == 1e-3


def test_gradient_bias_of_a_scaled_gradient():
    a, b = Student(ProxyConfig(depth=2, width=8)), Student(ProxyConfig(depth=2, width=8))
    for p_a, p_b in zip(a.parameters(), b.parameters(), strict=True):
        p_b.grad = torch.randn_like(p_b)
        p_a.grad = 1.1 * p_b.grad
    a.blocks[1].fc1.weight.grad = -b.blocks[1].fc1.weight.grad
    bias = gradient_bias(a, b)
    assert bias["paired/blocks.0/grad_zeta"] == pytest.approx(0.1)
    assert bias["paired/blocks.0/grad_cos"] == pytest.approx(1.0)
    assert bias["paired/blocks.0/grad_rel_err"] == pytest.approx(0.01)
    assert bias["paired/blocks.1/grad_cos"] < 0.9
    assert bias["paired/grad_zeta"] < 0.1


def test_paired_fp32_twin_is_exact(tmp_path):
    summary = train_run(_spec(True, {}), tmp_path)
    wide = _wide(tmp_path)
    assert summary["state"] == "done" and summary["kind"] == "proxy"
    assert (wide["train/loss"] == wide["paired/fp32_loss"]).all()
    assert (wide["paired/grad_rel_err"] == 0).all()
    assert wide["paired/grad_cos"].to_numpy() == pytest.approx(1.0, abs=1e-12)


def test_paired_mx_run_logs_bias_and_leaves_the_mx_trajectory_alone(tmp_path):
    paired = train_run(_spec(True, MX), tmp_path / "paired")
    alone = train_run(_spec(False, MX), tmp_path / "alone")
    fp32 = train_run(_spec(False, {}), tmp_path / "fp32")
    wide, alone_wide = _wide(tmp_path / "paired"), _wide(tmp_path / "alone")
    fp32_wide = _wide(tmp_path / "fp32")
    # The twin does not perturb the MX run, and is itself the plain FP32 run.
    assert (wide["train/loss"] == alone_wide["train/loss"]).all()
    assert (wide["paired/fp32_loss"] == fp32_wide["train/loss"]).all()
    assert paired["final_train_loss"] == alone["final_train_loss"] != fp32["final_train_loss"]
    # MX E4M3 perturbs the gradient by a few percent at the start, not more.
    first = wide.loc[1]
    assert 0.95 < first["paired/grad_cos"] < 1.0
    assert 1e-5 < first["paired/grad_rel_err"] < 0.05
    for block in (0, 1):
        assert f"paired/blocks.{block}/grad_cos" in wide
        assert 0 <= wide.loc[10, f"mx/clip/blocks.{block}.fc1/a"] < 0.1
        assert 0 <= wide.loc[10, f"ln/blocks.{block}.ln/weight_clip"] <= 1
        assert wide.loc[10, f"ln/blocks.{block}.ln/bias_std"] > 0
    assert wide["paired/fp32_val_loss"].notna().sum() == 2


def test_ln_in_real_mx_blocks_clips_clustered_weights():
    """The paper's hypothesis, made testable: LN weights clustered just under a power of two
    overflow E4M3 when they share a block with a smaller max, and real MX LN clamps them."""
    import mx

    cfg = ProxyConfig(depth=1, width=32)
    student = Student(cfg)
    with torch.no_grad():
        student.blocks[0].ln.weight.fill_(1.9)
        student.blocks[0].ln.weight[0] = 1.0
    mx_spec = PrecisionSpec(**{**MX, "ln": "mx"})
    rate = mx.clip_rate(student.blocks[0].ln.weight.detach(), "fp8_e4m3")
    # amax 1.9 -> scale 2^(0-8); 1.9/2^-8 = 486 > 448: every 1.9 clips, the 1.0 does not.
    assert rate == pytest.approx(31 / 32)
    quantized = mx.apply(student, mx_spec)
    x = torch.randn(4, 32)
    affine = quantized.blocks[0].ln._affine(quantized.blocks[0].ln.weight)
    assert affine[1].item() == 448 * 2.0**-8
    assert quantized(x).shape == (4, 32)


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_each_arm_changes_what_it_names(arm):
    # The paper's arms act on the paper's ops (precision.profile: paper).
    parent = PrecisionSpec(**MX, profile="paper" if arm.startswith("paper_") else "ocp")
    child = apply_arm(arm, parent)
    changed = {k for k, v in child.model_dump().items() if parent.model_dump()[k] != v}
    expected = {
        "control": set(),
        "full_precision": {"w_fmt", "a_fmt", "grad_fmt", "bwd_w_fmt", "bwd_a_fmt"}
        | {"elementwise", "ln"},
        "rceil": {"scale_rule"},
        "no_ln_quant": {"ln"},
        "bf16_act_fwd": {"a_fmt"},
        "bf16_act_fwd_bwd": {"a_fmt", "grad_fmt", "bwd_a_fmt"},
        "no_bwd_quant": {"quantize_backward"},
        "no_gelu_quant": {"quantize_gelu"},
        "bf16_weights": {"w_fmt", "bwd_w_fmt"},
        "paper_bump": {"scale_rule"},
        "paper_no_ln_quant": {"ln", "ln_internals"},
        "paper_bf16_act_fwd": {"a_fmt", "bwd_a_fmt"},
        "paper_no_bwd_quant": {"quantize_backward"},
        "paper_bf16_weights": {"w_fmt"},
    }[arm]
    assert changed == expected
    assert child.is_noop == (arm == "full_precision")


def test_unknown_arm_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown arm 'fp4'; allowed: control, full_precision"):
        apply_arm("fp4", PrecisionSpec())


def test_summary_is_json(tmp_path):
    summary = train_run(_spec(False, MX), tmp_path)
    assert json.loads(json.dumps(summary))["n_params"] == _spec(False, MX).model.param_count()


def test_proxy_grids_expand_as_documented(repo_root):
    from sweep.grid import expand_grid, load_grid

    cpu = expand_grid(load_grid(repo_root / "grids" / "proxy_cpu.yaml")).runs
    assert len(cpu) == 6
    assert {(s.tags["config"], s.model.paired) for s in cpu} == {
        ("fp32", False),
        ("bf16", False),
        ("mx_e4m3", True),
    }
    paper = expand_grid(load_grid(repo_root / "grids" / "proxy_paper.yaml")).runs
    assert len(paper) == 10 and {s.seed for s in paper} == set(range(5))
    for spec in paper:
        m, t = spec.model, spec.train
        assert (m.depth, m.width, t.batch_size, t.lr, t.steps) == (4, 512, 2048, 6e-4, 9000)
        assert (t.schedule, t.beta2, t.grad_clip, t.device) == ("constant", 0.999, 0, "cuda")
        if spec.tags["config"] == "mx_e4m3":
            p = spec.precision
            assert m.paired and p.ln == "bf16" and p.elementwise == "bf16"
            assert {p.w_fmt, p.a_fmt, p.grad_fmt, p.bwd_w_fmt, p.bwd_a_fmt} == {"fp8_e4m3"}
