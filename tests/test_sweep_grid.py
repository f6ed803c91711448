"""Grid loading, expansion, derived steps, stable ids and specific errors."""

from pathlib import Path

import pytest
import yaml

from models.flops import lm_param_count
from sweep.grid import GridError, expand_grid, load_grid


def write_grid(tmp_path: Path, grid: dict, name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(grid))
    return path


BASE = {"model": {"vocab_size": 1000, "seq_len": 128}, "train": {"batch_size": 32}}


def test_cross_product_counts_and_derived_steps(tmp_path):
    path = write_grid(
        tmp_path,
        {
            "name": "g",
            "base": BASE,
            "axes": {
                "budget": [1e13, 3e13],
                "d_model": [64, 128, 192],
                "precision": [
                    {"w_fmt": "bf16", "a_fmt": "bf16"},
                    {"w_fmt": "fp8_e4m3", "a_fmt": "fp8_e4m3"},
                ],
                "seed": [0, 1],
            },
        },
    )
    runs = expand_grid(load_grid(path), path).runs
    assert len(runs) == 2 * 3 * 2 * 2
    for spec in runs:
        layers = spec.model.d_model // 64
        assert spec.model.n_layers == layers
        n_params = lm_param_count(spec.model.d_model, layers, 1000)
        assert spec.train.steps == int(spec.budget // (6 * n_params) // (32 * 128))
    configs = {spec.tags["config"] for spec in runs}
    assert configs == {"bf16_bf16", "fp8_e4m3_fp8_e4m3"}


def test_run_ids_are_stable_and_distinct(tmp_path):
    grid = {
        "name": "g",
        "base": BASE,
        "axes": {"budget": [1e13], "d_model": [64, 128], "seed": [0, 1]},
    }
    first = [s.run_id for s in expand_grid(load_grid(write_grid(tmp_path, grid))).runs]
    # Reordering keys and adding resources does not change which runs these are.
    grid2 = {
        "axes": {"seed": [0, 1], "d_model": [64, 128], "budget": [1e13]},
        "base": {**BASE, "resources": {"cpus": 2}},
        "name": "g",
    }
    second = [s.run_id for s in expand_grid(load_grid(write_grid(tmp_path, grid2, "b.yaml"))).runs]
    assert sorted(first) == sorted(second)
    assert len(set(first)) == 4
    assert all(len(rid) == 12 for rid in first)


def test_zip_advances_axes_together(tmp_path):
    path = write_grid(
        tmp_path,
        {
            "name": "g",
            "base": {**BASE, "train": {"steps": 10, "batch_size": 32}},
            "axes": {"d_model": [64, 128], "train.lr": [1e-3, 5e-4], "seed": [0, 1, 2]},
            "zip": [["d_model", "train.lr"]],
        },
    )
    runs = expand_grid(load_grid(path)).runs
    assert len(runs) == 2 * 3
    assert {(s.model.d_model, s.train.lr) for s in runs} == {(64, 1e-3), (128, 5e-4)}


def test_paper_filter_keeps_only_2_to_200_tokens_per_param(tmp_path):
    path = write_grid(
        tmp_path,
        {
            "name": "g",
            "base": {"model": {"seq_len": 512}, "train": {"batch_size": 512}},
            "axes": {
                "budget": {"geomspace": [2e17, 1e19, 6], "extra": [2.2e19, 4.84e19]},
                "d_model": list(range(256, 1409, 64)),
            },
            "filters": {"tokens_per_param": [2, 200]},
        },
    )
    expansion = expand_grid(load_grid(path))
    assert expansion.dropped["tokens_per_param"] > 0
    for spec in expansion.runs:
        ratio = spec.train.steps * 512 * 512 / spec.model.param_count()
        assert 2 < ratio < 200
    budgets = sorted({s.budget for s in expansion.runs})
    assert budgets[0] == 2e17 and budgets[-1] == 4.84e19
    assert pytest.approx(budgets[1], rel=1e-3) == 4.373e17


def test_include_merges_base(tmp_path):
    write_grid(tmp_path, {"base": BASE, "filters": {"min_steps": 1}}, "common.yaml")
    path = write_grid(
        tmp_path,
        {
            "include": "common.yaml",
            "name": "g",
            "base": {"train": {"lr": 1e-3}},
            "axes": {"budget": [1e13], "d_model": [64]},
        },
    )
    (spec,) = expand_grid(load_grid(path)).runs
    assert spec.train.lr == 1e-3 and spec.train.batch_size == 32 and spec.model.seq_len == 128


@pytest.mark.parametrize(
    ("grid", "needles"),
    [
        (
            {"name": "g", "base": BASE, "axes": {"d_model": [64]}, "bogus": 1},
            ["bogus", "unknown key", "allowed"],
        ),
        (
            {"name": "g", "base": {**BASE, "model": {"dmodel": 64}}, "axes": {"budget": [1e13]}},
            ["model.dmodel", "unknown key", "d_model"],
        ),
        (
            {"name": "g", "base": BASE, "axes": {"budget": [1e13], "d_model": []}},
            ["axes.d_model", "empty"],
        ),
        (
            {
                "name": "g",
                "base": BASE,
                "axes": {"budget": [1e13], "d_model": [64], "precision": [{"w_fmt": "fp9"}]},
            },
            ["axes.precision[0].w_fmt", "fp9", "fp8_e4m3", "int8"],
        ),
        (
            {"name": "g", "base": BASE, "axes": {"budget": ["lots"], "d_model": [64]}},
            ["axes.budget[0]", "lots"],
        ),
        (
            {
                "name": "g",
                "base": {**BASE, "train": {"batch_size": "big"}},
                "axes": {"budget": [1e13], "d_model": [64]},
            },
            ["train.batch_size", "big"],
        ),
        (
            {"name": "g", "base": BASE, "axes": {"colour": [1]}},
            ["axes.colour", "unknown axis", "budget"],
        ),
    ],
)
def test_bad_grids_name_file_key_and_allowed_values(tmp_path, grid, needles):
    path = write_grid(tmp_path, grid)
    with pytest.raises(GridError) as err:
        expand_grid(load_grid(path), path)
    message = str(err.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_demo_grid_is_big_enough_to_show_a_trend(repo_root):
    path = repo_root / "grids" / "demo.yaml"
    runs = expand_grid(load_grid(path), path).runs
    assert len({s.budget for s in runs}) >= 3
    assert len({s.model.d_model for s in runs}) >= 3
    assert {s.tags["config"] for s in runs} >= {"bf16_bf16", "fp8_e4m3_fp8_e4m3"}
    # Issue 18: >= 5 budgets, each with >= 3 sizes (an IsoFLOP parabola), and an MX format
    # whose gap to bf16 shows (MXFP4) beside MXFP8.
    budgets = {s.budget for s in runs}
    assert len(budgets) >= 5
    for budget in budgets:
        sizes = {s.model.d_model for s in runs if s.budget == budget}
        assert len(sizes) >= 3, (budget, sizes)
    assert "fp4_e2m1_fp4_e2m1" in {s.tags["config"] for s in runs}
    assert len(runs) == 60


def test_paper_grid_covers_every_published_run(repo_root):
    """grids/mx_vs_bf16.yaml holds the paper's 16 configurations and every (C, d_model) point
    of its published run table (the table has fewer: not every point finished)."""
    import pandas as pd

    path = repo_root / "grids" / "mx_vs_bf16.yaml"
    runs = expand_grid(load_grid(path), path).runs
    paper = pd.read_csv(repo_root / "analysis" / "data" / "runs.csv")
    ours = {(spec.tags["config"], round(spec.budget / 1e15), spec.model.d_model) for spec in runs}
    theirs = {
        (row.config, round(row.total_flops / 1e15), row.d_model) for row in paper.itertuples()
    }
    assert {c for c, _, _ in ours} == set(paper["config"])
    assert theirs <= ours
    assert len(runs) == 16 * 95
    by_shape = {spec.model.d_model: spec for spec in runs}
    assert by_shape[512].model.param_count() == 57_950_720
    assert by_shape[512].model.n_layers == 8
