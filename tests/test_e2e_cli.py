"""End to end through the real CLI: launch a micro grid locally, status, analyze, relaunch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

SWEEP = [sys.executable, "-m", "sweep.cli"]


def sweep(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*SWEEP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_micro_grid_launch_status_analyze_relaunch(tmp_path, repo_root):
    grid = repo_root / "tests" / "grids" / "micro.yaml"
    sweep_dir = tmp_path / "sweep"
    launched = sweep(
        "launch", str(grid), "--sweep-dir", str(sweep_dir), "--executor", "local", cwd=repo_root
    )
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "submitted 8 via local" in launched.stdout

    status = sweep("status", str(sweep_dir), cwd=repo_root)
    assert status.returncode == 0, status.stderr
    assert "8 runs by state" in status.stdout and "done" in status.stdout
    report = json.loads(sweep("status", str(sweep_dir), "--json", cwd=repo_root).stdout)
    assert report["counts"] == {"done": 8}
    for row in report["runs"]:
        assert row["step"] == row["total_steps"] > 0
        assert row["loss"] is not None and 0 < row["loss"] < 5

    for run_dir in (sweep_dir / "runs").iterdir():
        table = pq.read_table(run_dir / "metrics").to_pandas()
        spec = json.loads((run_dir / "spec.json").read_text())
        losses = table[table["name"] == "train/loss"].sort_values("step")
        assert losses["step"].is_unique
        assert losses["value"].iloc[-1] < losses["value"].iloc[0]
        assert set(table["run_id"]) == {run_dir.name}
        assert table["step"].max() <= spec["train"]["steps"]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["state"] == "done" and summary["steps_done"] == spec["train"]["steps"]

    figures = tmp_path / "figs"
    analyzed = sweep(
        "analyze", str(sweep_dir), "--plot", "scaling", "--out", str(figures), cwd=repo_root
    )
    assert analyzed.returncode == 0, analyzed.stdout + analyzed.stderr
    png = figures / "scaling.png"
    assert png.is_file() and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    mtimes = {p: p.stat().st_mtime for p in sweep_dir.glob("runs/*/summary.json")}
    again = sweep("launch", str(grid), "--sweep-dir", str(sweep_dir), cwd=repo_root)
    assert again.returncode == 0, again.stderr
    assert "submitted 0" in again.stdout and "8 done" in again.stdout
    assert mtimes == {p: p.stat().st_mtime for p in sweep_dir.glob("runs/*/summary.json")}


def test_bad_grid_exits_2_and_creates_nothing(tmp_path, repo_root):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\naxes:\n  budget: [1.0e+9]\n  d_model: [32]\n"
        "  precision: [{w_fmt: fp9, a_fmt: bf16}]\n"
    )
    sweep_dir = tmp_path / "sweep"
    result = sweep("launch", str(bad), "--sweep-dir", str(sweep_dir), cwd=repo_root)
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr and "w_fmt" in result.stderr and "fp9" in result.stderr
    assert "fp8_e4m3" in result.stderr
    assert not sweep_dir.exists()


def test_unknown_executor_exits_2(tmp_path, repo_root):
    grid = repo_root / "tests" / "grids" / "micro.yaml"
    result = sweep(
        "launch",
        str(grid),
        "--sweep-dir",
        str(tmp_path / "s"),
        "--executor",
        "kubernetes",
        cwd=repo_root,
    )
    assert result.returncode == 2
    assert "kubernetes" in result.stderr and "local" in result.stderr
    assert not (tmp_path / "s").exists()
