"""The paper's proxy experiments as grids, expanded as they ran."""

import pytest

from sweep.grid import expand_grid, load_grid
from sweep.intervene import BranchPlan, branch_specs, parse_arms


def _runs(repo_root, name):
    path = repo_root / "grids" / name
    return expand_grid(load_grid(path), path).runs


def _is_paper_mx(p):
    return (p.profile, p.pre_round, p.ln_bias_grad, p.ln_internals) == (
        "paper", "bf16", False, "bf16"
    ) and {p.w_fmt, p.a_fmt, p.grad_fmt, p.bwd_w_fmt, p.bwd_a_fmt} == {"fp8_e4m3"}  # fmt: skip


def _is_paper_teacher(m):
    return (m.teacher_bias, m.teacher_width, m.noise_std, m.teacher_precision) == (
        False, m.width, 0.005, "student"
    )  # fmt: skip


def test_canonical_run_and_its_interventions(repo_root):
    (spec,) = _runs(repo_root, "proxy_paper_canonical.yaml")
    m, t = spec.model, spec.train
    assert (m.depth, m.width, t.batch_size, t.lr, t.steps, spec.seed) == (
        4,
        512,
        2048,
        6e-4,
        9000,
        1337,
    )
    assert (t.schedule, t.warmup_frac, t.beta1, t.beta2) == ("constant", 0, 0.9, 0.999)
    assert m.paired and _is_paper_teacher(m) and _is_paper_mx(spec.precision)
    assert not spec.precision.quantize_gelu
    assert 4500 % t.keep_checkpoints_every == 0 and 4700 % t.keep_checkpoints_every == 0
    plan = BranchPlan(spec.run_id, [4500, 4700], "the paper's checkpoints")
    branches = branch_specs(spec, plan, parse_arms("paper"))
    assert len(branches) == 18
    by_arm = {(b.branch.arm, b.branch.step): b.precision for b in branches}
    assert by_arm[("paper_bump", 4500)].scale_rule == "paper_bump"
    assert by_arm[("full_precision", 4700)].is_noop
    act = by_arm[("paper_bf16_act_fwd", 4700)]
    assert (act.a_fmt, act.bwd_a_fmt, act.grad_fmt) == ("bf16", "bf16", "fp8_e4m3")
    weights = by_arm[("paper_bf16_weights", 4500)]
    assert (weights.w_fmt, weights.bwd_w_fmt) == ("bf16", "fp8_e4m3")
    assert not by_arm[("paper_no_bwd_quant", 4500)].quantize_backward
    assert all(not p.ln_bias_grad for (arm, _), p in by_arm.items() if arm != "full_precision")


def test_ln_fix_runs(repo_root):
    runs = {s.tags["config"]: s for s in _runs(repo_root, "proxy_paper_ln_fix.yaml")}
    assert set(runs) == {"mx_e4m3_no_ln_quant", "mx_e4m3_bump"}
    for spec in runs.values():
        m, t = spec.model, spec.train
        assert (m.depth, m.width, t.batch_size, t.lr, t.steps) == (3, 512, 2048, 5e-4, 11000)
        assert m.paired and _is_paper_teacher(m) and not spec.precision.ln_bias_grad
    noln = runs["mx_e4m3_no_ln_quant"].precision
    assert (noln.ln, noln.ln_internals) == ("none", "bf16_tail")
    assert _is_paper_mx(runs["mx_e4m3_bump"].precision)
    assert runs["mx_e4m3_bump"].precision.scale_rule == "paper_bump"


@pytest.mark.parametrize(
    "grid, width, seeds",
    [
        ("proxy_confound.yaml", 512, {1337, 1, 2, 3, 4}),
        ("proxy_confound_cpu.yaml", 128, {1337, 1, 2}),
        ("../tests/grids/proxy_confound_micro.yaml", 32, {0, 1, 2}),
    ],
)
def test_confound_grids_cross_four_configs_with_the_same_seeds(repo_root, grid, width, seeds):
    runs = _runs(repo_root, grid)
    configs = {}
    for spec in runs:
        configs.setdefault(spec.tags["config"], set()).add(spec.seed)
        assert spec.model.width == width and _is_paper_teacher(spec.model)
    assert configs == dict.fromkeys(
        ["fp32", "fp32_frozen_ln_bias", "mx_paper", "mx_trained_ln_bias"], seeds
    )
    p = {s.tags["config"]: s.precision for s in runs}
    assert p["fp32"].is_noop and p["fp32"].ln_bias_grad
    frozen = p["fp32_frozen_ln_bias"]
    assert not frozen.ln_bias_grad and {frozen.w_fmt, frozen.a_fmt} == {"fp32"}
    assert _is_paper_mx(p["mx_paper"])
    trained = p["mx_trained_ln_bias"]
    assert trained.ln_bias_grad and trained.pre_round == "bf16" and trained.ln_internals == "bf16"


def test_lm_paper_grid_uses_the_profile_and_mitchell(repo_root):
    runs = _runs(repo_root, "mx_vs_bf16.yaml")
    assert all(s.precision.profile == "paper" and s.model.init == "mitchell" for s in runs)
