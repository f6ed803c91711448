"""The whole sweep on a real SLURM through the CLI: preemption, a killed job, a controller
restart and racing launches. Counts runs lost and duplicated (both must be 0)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from executor_fixtures import requires_slurm, wait_until

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    requires_slurm,
]
SWEEP = [sys.executable, "-m", "sweep.cli"]
SLURMCTLD_PID = Path("/run/slurm/slurmctld.pid")
STEPS = 6000


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SWEEP, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def status(sweep_dir: Path, cwd: Path) -> dict[str, dict]:
    result = cli("status", str(sweep_dir), "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return {row["run_id"]: row for row in json.loads(result.stdout)["runs"]}


def running(sweep_dir: Path, cwd: Path, min_step: int) -> list[str]:
    return [
        run_id
        for run_id, row in status(sweep_dir, cwd).items()
        if row["state"] == "running" and row["step"] >= min_step
    ]


def signal_job(*args: str) -> None:
    """scancel, retried while SLURM answers "Job can not be altered now" (a sibling array
    task was just signalled)."""
    for _ in range(20):
        if subprocess.run(["scancel", *args], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"scancel {' '.join(args)} kept failing")


def restart_controller(repo_root: Path) -> None:
    os.kill(int(SLURMCTLD_PID.read_text()), signal.SIGTERM)
    wait_until(
        lambda: (
            subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout.count("UP")
            == 0
        ),
        30,
        "slurmctld down",
    )
    # Only the controller: the full bring-up's smoke job would queue behind the sweep.
    subprocess.run(["slurmctld"], check=True, timeout=60)
    wait_until(
        lambda: "UP" in subprocess.run(["scontrol", "ping"], capture_output=True, text=True).stdout,
        60,
        "slurmctld up again",
    )


def test_sweep_survives_preemption_kill_restart_and_races(tmp_path, repo_root):
    spec = yaml.safe_load((repo_root / "tests" / "grids" / "resume.yaml").read_text())
    # Long enough (about a minute a run) that signals land mid-run even on a loaded machine.
    spec["base"]["train"].update(steps=STEPS, checkpoint_every=100)
    grid = tmp_path / "resume_slurm.yaml"
    grid.write_text(yaml.safe_dump(spec))
    sweep_dir = tmp_path / "sweep"
    first = cli(
        "launch",
        str(grid),
        "--sweep-dir",
        str(sweep_dir),
        "--executor",
        "slurm",
        "--array-parallelism",
        "2",
        cwd=repo_root,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    assert "submitted 4 via slurm" in first.stdout
    try:
        rows = status(sweep_dir, repo_root)
        assert {r["state"] for r in rows.values()} <= {"queued", "running"}
        # Racing launches while everything is queued or running submit nothing.
        racers = [
            subprocess.Popen(
                [*SWEEP, "launch", str(grid), "--sweep-dir", str(sweep_dir)],
                cwd=repo_root,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        assert all("submitted 0" in r.communicate(timeout=120)[0] for r in racers)

        # With 2 array slots, two runs train side by side: preempt one, SIGKILL the other.
        pair: list[str] = []

        def two_running() -> bool:
            pair[:] = running(sweep_dir, repo_root, 1)
            return len(pair) == 2

        wait_until(two_running, 240, "two runs training at once")
        preempted, killed = pair
        jobs = {rid: row["job_id"] for rid, row in status(sweep_dir, repo_root).items()}
        # SIGKILL first: a requeue of one array task briefly hides its siblings' ids.
        signal_job("--full", "--signal=KILL", jobs[killed])
        signal_job("--signal=USR2", jobs[preempted])
        restart_controller(repo_root)

        def settled() -> bool:
            states = {r["state"] for r in status(sweep_dir, repo_root).values()}
            # scancel --signal=KILL reads CANCELLED in sacct: a cancelled run, as a user's
            # scancel is (see slurm/README.md), resubmitted here by --retry-failed.
            return states <= {"done", "stale", "failed", "preempted", "cancelled"}

        # A requeue that met the controller down leaves the run preempted; the relaunch
        # resubmits it (and the killed one) and resumes both from their checkpoints.
        wait_until(settled, 300, "every job to end")
        again = cli(
            "launch",
            str(grid),
            "--sweep-dir",
            str(sweep_dir),
            "--executor",
            "slurm",
            "--retry-failed",
            cwd=repo_root,
        )
        assert again.returncode == 0, again.stderr
        wait_until(
            lambda: {r["state"] for r in status(sweep_dir, repo_root).values()} == {"done"},
            300,
            "all runs done after the relaunch",
        )
    finally:
        subprocess.run(["scancel", "--name", f"sweep-{sweep_dir.name}"], check=False)

    rows = status(sweep_dir, repo_root)
    lost = sum(r["state"] != "done" for r in rows.values())
    duplicated = 0
    for run_id in rows:
        run_dir = sweep_dir / "runs" / run_id
        steps = pq.read_table(run_dir / "metrics").to_pandas().query("name == 'train/loss'")["step"]
        duplicated += int(steps.duplicated().sum())
        assert set(steps) == {1, *range(5, STEPS + 1, 5)}, run_id
    assert (lost, duplicated) == (0, 0)
    log = "".join(p.read_text() for p in (sweep_dir / "runs" / preempted / "logs").glob("*.out"))
    resumed_at = [
        int(line.split("resuming from step ")[1].split()[0])
        for line in log.splitlines()
        if "resuming from step" in line
    ]
    assert resumed_at and resumed_at[0] >= 1, log
