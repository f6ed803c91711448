"""`sweep launch --executor ray` end to end through the console command, on the local Ray the
executor starts itself: runs train, status reports them done, a relaunch submits nothing."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from executor_fixtures import two_run_grid


def sweep(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m sweep`: the console command's own entry point."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "sweep", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_ray_launch_status_and_idempotent_relaunch(tmp_path: Path, repo_root: Path):
    grid = two_run_grid(repo_root, tmp_path)
    sweep_dir = tmp_path / "sweep"
    launch = ("launch", str(grid), "--sweep-dir", str(sweep_dir), "--executor", "ray")

    launched = sweep(*launch, "--workers", "2", cwd=tmp_path)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert "2 runs in grid; submitted 2 via ray; skipped: none" in launched.stdout
    # The progress display heard of both trials' ends from the Ray executor.
    assert "done 2  failed 0" in launched.stdout

    status = sweep("status", str(sweep_dir), "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["counts"] == {"done": 2}
    assert sorted(row["config"] for row in report["runs"]) == ["bf16_bf16", "fp8_e4m3_fp8_e4m3"]
    for row in report["runs"]:
        assert row["step"] == row["total_steps"] > 0
        assert row["attempt"] == 1
        # Trained: clearly below the loss of a uniform guess over the 64-token vocabulary.
        assert math.isfinite(row["loss"]) and 0 < row["loss"] < 0.9 * math.log(64)

    for row in report["runs"]:
        run_dir = sweep_dir / "runs" / row["run_id"]
        table = pq.read_table(run_dir / "metrics").to_pandas()
        losses = table[table["name"] == "train/loss"].sort_values("step")
        assert set(table["run_id"]) == {row["run_id"]}
        assert losses["step"].is_unique and losses["step"].max() <= row["total_steps"]
        assert losses["value"].iloc[-1] < losses["value"].iloc[0]
        # The trial ran `python -m sweep.run` with its output in the run's own log.
        assert (run_dir / "logs" / "attempt-1.out").exists()

    summaries = sorted(sweep_dir.glob("runs/*/summary.json"))
    mtimes = [path.stat().st_mtime_ns for path in summaries]
    again = sweep(*launch, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 runs in grid; submitted 0 via ray; skipped: 2 done" in again.stdout
    assert "Started a local Ray instance" not in again.stdout + again.stderr
    assert [path.stat().st_mtime_ns for path in summaries] == mtimes
