"""The LN-bias confound study end to end at test size, and its table."""

import subprocess
import sys

import pandas as pd
import pytest

from analysis.confound import CONFIGS, confound_table


def test_confound_table_counts_divergence_and_when():
    runs = pd.DataFrame(
        {
            "config": ["fp32", "fp32", "mx_paper", "mx_paper"],
            "seed": [0, 1, 0, 1],
            "diverged": [False, False, True, False],
            "trouble_step": pd.array([None, None, 40, 70], dtype="Int64"),
            "final_train_loss": [0.1, 0.2, float("nan"), 0.3],
        }
    )
    table = confound_table(runs).set_index("config")
    assert table.loc["fp32", ["runs", "diverged", "in_trouble"]].tolist() == [2, 0, 0]
    assert table.loc["mx_paper", ["diverged", "in_trouble", "first_trouble_step"]].tolist() == [
        1,
        2,
        40,
    ]
    assert table.loc["mx_paper", "median_trouble_step"] == 55


@pytest.mark.slow
def test_micro_confound_grid_runs_end_to_end(tmp_path, repo_root):
    sweep = tmp_path / "confound"
    cli = [sys.executable, "-m", "sweep"]
    grid = repo_root / "tests" / "grids" / "proxy_confound_micro.yaml"
    subprocess.run(
        [*cli, "launch", str(grid), "--sweep-dir", str(sweep)], check=True, cwd=repo_root
    )
    out = tmp_path / "figures"
    subprocess.run(
        [
            *cli,
            "analyze",
            str(sweep),
            "--table",
            "confound",
            "--plot",
            "confound",
            "--out",
            str(out),
        ],
        check=True,
        cwd=repo_root,
    )
    assert (out / "confound.png").stat().st_size > 0
    table = pd.read_csv(out / "confound.csv").set_index("config")
    assert list(table.index) == list(CONFIGS) and (table["runs"] == 3).all()
    runs = pd.read_csv(out / "confound_runs.csv")
    assert set(runs["state"]) <= {"done", "diverged"}
    final = runs.pivot_table(index="seed", columns="config", values="final_train_loss")
    # Freezing the LN bias changes the trajectory in both precisions, and MX changes it too.
    assert (final["fp32"] != final["fp32_frozen_ln_bias"]).all()
    assert (final["mx_paper"] != final["mx_trained_ln_bias"]).all()
    assert (final["fp32_frozen_ln_bias"] != final["mx_paper"]).all()
