"""A launcher SIGKILLed at each step of a SLURM submission (SWEEP_KILL_AT), on a real SLURM:
status never raises, one plain relaunch finishes every run, exactly one job trains each run,
and no orphan task or stray submitit file is left."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from executor_fixtures import requires_slurm, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow, requires_slurm]
SWEEP = [sys.executable, "-m", "sweep.cli"]
TIMEOUT_S = 300


def _grid(repo_root: Path, tmp_path: Path) -> Path:
    """Four micro runs (one budget, two shapes, two precisions)."""
    grid = yaml.safe_load((repo_root / "tests" / "grids" / "micro.yaml").read_text())
    grid["axes"]["budget"] = grid["axes"]["budget"][:1]
    path = tmp_path / "four_runs.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """PATH with an scontrol that reports MaxArraySize=3: chunks of two, so two sbatch calls."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        real = shutil.which("scontrol")
        script = bin_dir / "scontrol"
        script.write_text(
            "#!/bin/sh\n"
            f'if [ "$1 $2" = "show config" ]; then {real} "$@" | '
            "sed 's/^MaxArraySize .*/MaxArraySize            = 3/'; "
            f'else exec {real} "$@"; fi\n'
        )
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SWEEP_KILL_AT"}
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}", "OMP_NUM_THREADS": "1", **extra}


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SWEEP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def _status(sweep_dir: Path, env: dict[str, str], cwd: Path) -> dict[str, dict]:
    table = _cli("status", str(sweep_dir), env=env, cwd=cwd)
    assert table.returncode == 0 and "Traceback" not in table.stderr, table.stderr
    result = _cli("status", str(sweep_dir), "--json", env=env, cwd=cwd)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return {row["run_id"]: row for row in json.loads(result.stdout)["runs"]}


def _trainings(run_dir: Path) -> int:
    """How many processes started training this run (one log line each)."""
    lines = [
        line
        for path in (run_dir / "logs").glob("attempt-*.out")
        for line in path.read_text().splitlines()
    ]
    return sum(bool(re.match(r"attempt \d+: (starting|resuming)", line)) for line in lines)


def _queued_jobs(name: str) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-n", name, "-o", "%i|%T"], capture_output=True, text=True
    )
    return out.stdout.split()


@pytest.mark.parametrize(
    ("kill_at", "status_first"),
    [
        ("spec-2", True),
        ("before-sbatch-1", False),
        ("after-sbatch-1", False),
        ("submitted-1", True),
        ("after-chunk-1", False),
    ],
)
def test_killed_launcher_leaves_nothing_untracked(
    tmp_path: Path, repo_root: Path, kill_at: str, status_first: bool
):
    grid = _grid(repo_root, tmp_path)
    sweep_dir = tmp_path / f"crash-{kill_at}"
    job_name = f"sweep-{sweep_dir.name}"
    launch = ("launch", str(grid), "--sweep-dir", str(sweep_dir), "--executor", "slurm")
    env = _env(tmp_path)
    try:
        killed = _cli(*launch, env={**env, "SWEEP_KILL_AT": kill_at}, cwd=repo_root)
        assert killed.returncode == -9, killed.stdout + killed.stderr
        if status_first:
            # A status that finds the lock free settles the killed launch's intents itself.
            # An adopted task that ended before adoption (it found no submitted.json naming
            # its token) leaves its run stale: the relaunch resubmits it.
            rows = _status(sweep_dir, env, repo_root)
            assert len(rows) == 4
            assert {r["state"] for r in rows.values()} <= {"pending", "queued", "running", "stale"}
        again = _cli(*launch, env=env, cwd=repo_root)
        assert again.returncode == 0, again.stdout + again.stderr
        wait_until(
            lambda: {r["state"] for r in _status(sweep_dir, env, repo_root).values()} == {"done"},
            TIMEOUT_S,
            f"every run done after the relaunch ({kill_at})",
        )
        wait_until(lambda: not _queued_jobs(job_name), 60, "no task of the sweep left queued")
    finally:
        subprocess.run(["scancel", "--name", job_name], check=False)

    rows = _status(sweep_dir, env, repo_root)
    assert len(rows) == 4
    trained = {run_id: _trainings(sweep_dir / "runs" / run_id) for run_id in rows}
    assert trained == dict.fromkeys(rows, 1), trained
    for run_id, row in rows.items():
        assert row["step"] == row["total_steps"] > 0, run_id
    stray = [
        p.name
        for p in (sweep_dir / "slurm").iterdir()
        if re.fullmatch(r"[0-9a-f]{32}\.pkl", p.name)
    ]
    assert stray == []
    intents = [json.loads(p.read_text()) for p in (sweep_dir / "submissions").glob("*.json")]
    assert {i["state"] for i in intents} <= {"recorded", "adopted", "cancelled"}
    if kill_at.startswith("after-sbatch"):
        # The unrecorded chunk reached sbatch: its array was found by its token and cancelled.
        # (Its tasks may have ended already: they found no submitted.json naming their token.)
        cancelled = [i for i in intents if i["state"] == "cancelled"]
        assert len(cancelled) == 1 and len(cancelled[0]["cancelled_jobs"]) <= 1, intents
    if kill_at.startswith("submitted"):
        assert [i["state"] for i in intents].count("adopted") == 1, intents
