"""The NVFP4-vs-MX grids: expansion, and a micro version through sweep launch and analyze."""

import json

import pytest

from sweep.grid import expand_grid, load_grid
from tests.test_e2e_cli import sweep

RECIPE = "nvfp4_nvfp4_sr_grad_rht_keep_bf16_2"
CONFIGS = {"bf16_bf16", "fp8_e4m3_fp8_e4m3", "fp4_e2m1_fp4_e2m1", "nvfp4_nvfp4", RECIPE}


@pytest.mark.parametrize("name", ["nvfp4_vs_mx", "nvfp4_vs_mx_paper"])
def test_grids_expand_to_the_five_recipes(repo_root, name):
    path = repo_root / "grids" / f"{name}.yaml"
    runs = expand_grid(load_grid(path), path).runs
    assert {s.tags["config"] for s in runs} == CONFIGS
    recipe = next(s.precision for s in runs if s.tags["config"] == RECIPE)
    assert recipe.bwd_rounding == "stochastic" and recipe.rounding == "even"
    assert recipe.hadamard_wgrad and recipe.keep_bf16 == ("head", "blocks.-1")
    assert recipe.nvfp4_weight_block == "16x16"
    if name == "nvfp4_vs_mx_paper":
        assert {s.model.d_model for s in runs} >= {256, 1024, 2048}
        assert all(s.data.kind == "tokens" for s in runs)
        assert len({s.budget for s in runs}) == 8
    else:
        assert len({s.budget for s in runs}) == 3


@pytest.mark.slow
def test_micro_grid_launches_and_analyzes(tmp_path, repo_root):
    grid = repo_root / "tests" / "grids" / "nvfp4_micro.yaml"
    sweep_dir = tmp_path / "sweep"
    launched = sweep(
        "launch", str(grid), "--sweep-dir", str(sweep_dir), "--executor", "local", cwd=repo_root
    )
    assert launched.returncode == 0, launched.stdout + launched.stderr
    report = json.loads(sweep("status", str(sweep_dir), "--json", cwd=repo_root).stdout)
    assert report["counts"] == {"done": 5}
    summaries = [
        json.loads((d / "summary.json").read_text()) for d in (sweep_dir / "runs").iterdir()
    ]
    losses = {s["config"]: s["final_val_loss"] for s in summaries}
    assert set(losses) == CONFIGS
    assert all(s["final_val_loss"] < s["initial_loss"] for s in summaries)
    # Coarser formats train worse: NVFP4 (RNE) differs from MXFP4 and from the recipe.
    assert len(set(losses.values())) == 5
    out = tmp_path / "analysis"
    analyzed = sweep(
        "analyze", str(sweep_dir), "--table", "instability", "--out", str(out), cwd=repo_root
    )
    assert analyzed.returncode == 0, analyzed.stdout + analyzed.stderr
    table = next(out.glob("instability*.csv")).read_text()
    assert RECIPE in table and "nvfp4_nvfp4," in table
