"""`sweep analyze --table/--plot transfer` and `sweep plan --predict-from` through the CLI."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from analysis.synthetic import write_synthetic_sweep
from sweep.cli import app

CONFIGS = {"bf16_bf16": 1.0, "fp8_e4m3_fp8_e4m3": 0.6}
BUDGETS = [1e8, 3e8, 1e9, 3e9, 1e10]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("transfer_sweep")
    write_synthetic_sweep(
        root,
        configs=CONFIGS,
        budgets=BUDGETS,
        shapes=[(16, 1), (32, 1), (64, 1)],
        n_points=20,
        noise=0.002,
        metrics=False,
    )
    return root


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.mark.slow  # the held-out evaluation with the CLI's 100 bootstrap draws: ~15 s
def test_analyze_transfer_table_and_plot(sweep_dir, tmp_path):
    result = invoke(
        "analyze", sweep_dir, "--table", "transfer", "--plot", "transfer",
        "--cutoff", "1e9", "--out", tmp_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for name in ("transfer.csv", "transfer.md", "transfer_summary.csv", "transfer_fits.md"):
        assert (tmp_path / name).is_file(), name
    assert (tmp_path / "transfer.png").stat().st_size > 10_000
    table = pd.read_csv(tmp_path / "transfer.csv")
    # One row per (non-base configuration, budget above the cut-off).
    assert table[["config", "budget"]].values.tolist() == [
        ["fp8_e4m3_fp8_e4m3", 3e9],
        ["fp8_e4m3_fp8_e4m3", 1e10],
    ]
    for column in ("observed", "transfer", "transfer_lo", "transfer_hi", "own", "joint"):
        assert table[column].notna().all(), column
    assert (table["transfer_lo"] <= table["transfer"]).all()
    assert (table["transfer"] <= table["transfer_hi"]).all()
    assert "Fitted on budgets <= 1e+09" in (tmp_path / "transfer.md").read_text()


def test_analyze_transfer_bad_base_exits_2(sweep_dir, tmp_path):
    result = invoke(
        "analyze", sweep_dir, "--table", "transfer",
        "--base", "fp4_e2m1_fp4_e2m1", "--out", tmp_path,
    )  # fmt: skip
    assert result.exit_code == 2
    assert "'fp4_e2m1_fp4_e2m1' has no runs" in result.output


def test_plan_predict_from_sweep_json(sweep_dir, repo_root):
    result = invoke(
        "plan", repo_root / "tests/grids/micro.yaml", "--predict-from", sweep_dir, "--json"
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    by = {row["config"]: row["predicted_by"] for row in plan["runs"]}
    assert by == {"bf16_bf16": "own L(C)", "fp8_e4m3_fp8_e4m3": "transfer from bf16_bf16"}
    for row in plan["runs"]:
        assert row["predicted_lo"] <= row["predicted_loss"] <= row["predicted_hi"], row
    predicted = plan["totals"]["predicted"]
    assert predicted["runs"] == len(plan["runs"]) and predicted["unpredictable"] == 0
    assert predicted["flops"] == pytest.approx(sum(r["C"] for r in plan["runs"]))


@pytest.mark.slow  # fits bf16 and one transfer on the paper's table: ~10 s
def test_plan_predict_from_paper_table(repo_root):
    result = invoke("plan", repo_root / "tests/grids/micro.yaml", "--predict-from", "paper")
    assert result.exit_code == 0, result.output
    assert "predicted final val loss from paper" in result.output
    assert "transfer from bf16_bf16" in result.output
    assert "predicted: 8 of 8 runs" in result.output


def test_plan_predict_from_missing_folder_exits_2(repo_root, tmp_path):
    result = invoke("plan", repo_root / "tests/grids/micro.yaml", "--predict-from", tmp_path / "no")
    assert result.exit_code == 2
    assert "not a sweep folder" in result.output
