"""Paper-profile training runs: the frozen LN bias (row 2), the paper's teacher (row 6) and
the mitchell init (row 7)."""

import math

import pytest
import torch

from models.config import LMConfig, ProxyConfig, RunSpec
from models.init import mitchell_stds
from models.proxy import Teacher, TeacherData
from models.runner import train_run
from models.transformer import TransformerLM
from mx.spec import PrecisionSpec

MX_PAPER = {"profile": "paper", "w_fmt": "fp8_e4m3", "a_fmt": "fp8_e4m3", "elementwise": "bf16",
            "ln": "bf16"}  # fmt: skip
TRAIN = {"steps": 8, "batch_size": 64, "lr": 1e-2, "schedule": "constant", "warmup_frac": 0,
         "log_every": 4, "eval_every": 8, "eval_batches": 1, "checkpoint_every": 8}  # fmt: skip


def _final_ln_biases(precision: dict, tmp_path, **model) -> list[torch.Tensor]:
    spec = RunSpec.model_validate(
        {
            "model": {"kind": "proxy", "depth": 2, "width": 32, **model},
            "train": TRAIN,
            "precision": precision,
        }  # fmt: skip
    )
    train_run(spec, tmp_path)
    state = torch.load(next((tmp_path / "checkpoints").rglob("*.pt")), weights_only=False)
    return [v for k, v in state["model"].items() if k.endswith("ln.bias")]


@pytest.mark.parametrize(
    "precision, frozen",
    [
        (MX_PAPER, True),
        ({}, False),
        ({"ln_bias_grad": False}, True),  # the confound study's "FP32, frozen LN bias"
        ({**MX_PAPER, "ln_bias_grad": True}, False),
    ],
)
def test_ln_bias_trains_only_with_its_gradient(precision, frozen, tmp_path):
    biases = _final_ln_biases(precision, tmp_path)
    assert len(biases) == 2
    changed = [b.abs().max().item() > 0 for b in biases]  # nn.LayerNorm starts at 0
    assert changed == [not frozen] * 2


def test_paired_paper_run_reports_gradient_bias_with_a_frozen_bias(tmp_path):
    biases = _final_ln_biases(MX_PAPER, tmp_path, paired=True)
    assert all(b.abs().max() == 0 for b in biases)


def test_papers_teacher_has_no_biases_and_the_students_width():
    cfg = ProxyConfig(depth=2, width=16, teacher_bias=False, teacher_width=16)
    teacher = Teacher(cfg, seed=0)
    shapes = [tuple(p.shape) for p in teacher.parameters()]
    assert shapes == [(16, 16)] * 4
    default = [tuple(p.shape) for p in Teacher(ProxyConfig(depth=2, width=16), 0).parameters()]
    assert (64, 16) in default and (16,) in default


def test_student_precision_teacher_changes_train_targets_only():
    cfg = ProxyConfig(depth=2, width=32, teacher_bias=False, teacher_width=32, noise_std=0.005,
                      teacher_precision="student")  # fmt: skip
    spec = PrecisionSpec(**MX_PAPER)
    args = {"batch_size": 64, "eval_batches": 1, "seed": 3, "device": "cpu"}
    mx_data = TeacherData(cfg, precision=spec, **args)
    fp32_data = TeacherData(cfg.model_copy(update={"teacher_precision": "fp32"}), **args)
    (x1, y1), (x2, y2) = mx_data.train_batch(5), fp32_data.train_batch(5)
    assert torch.equal(x1, x2) and not torch.equal(y1, y2)
    # fresh noise (two independent draws of std 0.005) plus the MX teacher's error
    assert 0.005 * math.sqrt(2) * 0.95 < (y1 - y2).std() < 0.3 * y2.std()
    assert torch.equal(mx_data.val_batches()[0][1], fp32_data.val_batches()[0][1])
    # under an FP32 run the option is inert
    same = TeacherData(cfg, precision=PrecisionSpec(), **args)
    assert torch.equal(same.train_batch(5)[1], y2)


def test_mitchell_init_matches_sigma_per_module():
    cfg = LMConfig(d_model=128, n_layers=3, vocab_size=512, seq_len=16, init="mitchell")
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    modules = dict(model.named_modules())
    stds = mitchell_stds(model)
    assert stds["blocks.2.attn.out"] == pytest.approx(1 / math.sqrt(128) / math.sqrt(6))
    assert stds["blocks.0.mlp.fc2"] == pytest.approx(1 / math.sqrt(512) / math.sqrt(2))
    for path, sigma in stds.items():
        w = modules[path].weight
        # a normal truncated at 3 sigma has std 0.9866 sigma
        assert w.std().item() == pytest.approx(0.9866 * sigma, rel=0.05), path
        assert w.abs().max().item() <= 3 * sigma + 1e-7, path
    normal = TransformerLM(cfg.model_copy(update={"init": "normal"}))
    assert normal.blocks[2].attn.out.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_new_fields_at_their_defaults_keep_run_ids():
    spec = RunSpec.model_validate({"model": {"kind": "proxy"}, "train": {"steps": 5}})
    payload = spec.hashed_json()
    for key in ("teacher_bias", "teacher_width", "teacher_precision", "profile", "pre_round",
                "ln_bias_grad", "ln_internals"):  # fmt: skip
        assert key not in payload
    lm = RunSpec.model_validate({"model": {"d_model": 64}, "train": {"steps": 5}})
    assert '"init"' not in lm.hashed_json()
    paper = RunSpec.model_validate(
        {"model": {"kind": "proxy"}, "train": {"steps": 5}, "precision": {"profile": "paper"}}
    )
    assert paper.run_id != spec.run_id
