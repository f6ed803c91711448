"""A real training run on a real SLURM: preemption signals bring it back through its own
requeue (no relaunch, no --retry-failed), while a user's scancel cancels it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from executor_fixtures import requires_slurm, wait_until

from runfolder.atomic import read_json

pytestmark = [pytest.mark.slurm, pytest.mark.slow, requires_slurm]
SWEEP = [sys.executable, "-m", "sweep.cli"]
# Long enough that a quiet machine (~400 steps/s) is still training seconds after the signal.
STEPS = 6000
TIMEOUT_S = 300


def _one_run_grid(repo_root: Path, tmp_path: Path) -> Path:
    grid = yaml.safe_load((repo_root / "tests" / "grids" / "resume.yaml").read_text())
    grid["base"]["train"]["steps"] = STEPS
    grid["axes"]["seed"] = [0]
    path = tmp_path / "one_run.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*SWEEP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def _row(sweep_dir: Path, cwd: Path) -> dict:
    result = _cli("status", str(sweep_dir), "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)["runs"]
    return row


def _launch(grid: Path, sweep_dir: Path, cwd: Path, *extra: str) -> str:
    args = ("launch", str(grid), "--sweep-dir", str(sweep_dir), "--executor", "slurm", *extra)
    result = _cli(*args, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _start_lines(run_dir: Path) -> list[str]:
    return [
        line
        for path in sorted((run_dir / "logs").glob("attempt-*.out"))
        for line in path.read_text().splitlines()
        if line.startswith("attempt ")
    ]


def _wait_training(sweep_dir: Path, min_step: int) -> str:
    """The job id once the run trains past ``min_step``, read from the run's own markers:
    polling them (not a `sweep status` process per poll) cannot miss a fast run's window."""
    (run_dir,) = (sweep_dir / "runs").iterdir()

    def training() -> bool:
        marker = read_json(run_dir / "state.json") or {}
        return marker.get("state") == "running" and marker.get("step", 0) >= min_step

    wait_until(training, TIMEOUT_S, f"the run training past step {min_step}")
    return read_json(run_dir / "submitted.json")["job_id"]


@pytest.mark.parametrize("signal_name", ["TERM", "USR2"])
def test_preempted_training_run_comes_back_by_its_own_requeue(
    tmp_path: Path, repo_root: Path, signal_name: str
):
    grid = _one_run_grid(repo_root, tmp_path)
    sweep_dir = tmp_path / f"preempt-{signal_name}"
    assert "submitted 1 via slurm" in _launch(grid, sweep_dir, repo_root)
    try:
        job = _wait_training(sweep_dir, 200)
        # What SLURM sends on preemption (TERM) or before a time limit (USR2@90).
        subprocess.run(["scancel", f"--signal={signal_name}", job], check=True)
        wait_until(
            lambda: _row(sweep_dir, repo_root)["state"] == "done",
            TIMEOUT_S,
            "the requeued run to finish without a relaunch",
        )
    finally:
        subprocess.run(["scancel", "--name", f"sweep-{sweep_dir.name}"], check=False)

    row = _row(sweep_dir, repo_root)
    assert (row["job_id"], row["attempt"], row["step"]) == (job, 1, STEPS), "same job, requeued"
    run_dir = sweep_dir / "runs" / row["run_id"]
    starts = _start_lines(run_dir)
    assert len(starts) == 2 and starts[0].startswith("attempt 1: starting"), starts
    resumed_at = int(starts[1].split("resuming from step ")[1].split()[0])
    assert 200 <= resumed_at < STEPS, starts
    steps = pq.read_table(run_dir / "metrics").to_pandas().query("name == 'train/loss'")["step"]
    assert not steps.duplicated().any() and set(steps) == {1, *range(5, STEPS + 1, 5)}
    # A preemption is not a crash: the crash-retry budget is untouched.
    assert (read_json(run_dir / "retries.json") or {}).get("crash_retries", 0) == 0


def test_a_users_scancel_cancels_the_run_until_retry_failed(tmp_path: Path, repo_root: Path):
    grid = _one_run_grid(repo_root, tmp_path)
    sweep_dir = tmp_path / "scancel"
    _launch(grid, sweep_dir, repo_root)
    try:
        job = _wait_training(sweep_dir, 150)
        subprocess.run(["scancel", job], check=True)
        wait_until(
            lambda: _row(sweep_dir, repo_root)["state"] == "cancelled",
            TIMEOUT_S,
            "sacct's CANCELLED to show as a cancelled run",
        )
        assert "submitted 0 via slurm; skipped: 1 cancelled" in _launch(grid, sweep_dir, repo_root)
        assert "submitted 1 via slurm" in _launch(grid, sweep_dir, repo_root, "--retry-failed")
        wait_until(
            lambda: _row(sweep_dir, repo_root)["state"] == "done", TIMEOUT_S, "the retried run"
        )
    finally:
        subprocess.run(["scancel", "--name", f"sweep-{sweep_dir.name}"], check=False)
    row = _row(sweep_dir, repo_root)
    assert row["attempt"] == 2 and row["step"] == STEPS
    starts = _start_lines(sweep_dir / "runs" / row["run_id"])
    assert len(starts) == 2 and starts[1].startswith("attempt 2: resuming from step "), starts
