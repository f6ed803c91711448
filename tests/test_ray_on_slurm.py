"""slurm/ray-on-slurm.sbatch on a real SLURM: Ray inside one allocation runs the sweep; the
allocation scancelled mid-sweep (its Ray driver killed with it) leaves no run shown as
running, and a second allocation finishes the rest without training any run twice."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from executor_fixtures import requires_slurm, wait_until

from runfolder.atomic import read_json

pytestmark = [pytest.mark.slurm, pytest.mark.slow, requires_slurm]
TIMEOUT_S = 400


def _env() -> dict[str, str]:
    # The template needs `ray` and `sweep` of this virtualenv on PATH (sbatch exports it).
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}


def _sbatch(repo_root: Path, tmp_path: Path, grid: Path, sweep_dir: Path) -> str:
    argv = ["sbatch", "--parsable", "-c", "2", "--time=30", "--job-name", f"ray-{sweep_dir.name}"]
    argv += ["-o", str(tmp_path / "ray-%j.out"), "--chdir", str(repo_root)]
    argv += [str(repo_root / "slurm" / "ray-on-slurm.sbatch"), "sweep", "launch", str(grid)]
    argv += ["--sweep-dir", str(sweep_dir), "--executor", "ray", "--ray-address", "auto"]
    return subprocess.run(
        argv, env=_env(), capture_output=True, text=True, check=True
    ).stdout.strip()


def _rows(sweep_dir: Path) -> dict[str, dict]:
    argv = [sys.executable, "-m", "sweep.cli", "status", str(sweep_dir), "--json"]
    result = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return {row["run_id"]: row for row in json.loads(result.stdout)["runs"]}


def _any_training(sweep_dir: Path, min_step: int) -> bool:
    markers = (read_json(path) or {} for path in sweep_dir.glob("runs/*/state.json"))
    return any(m.get("state") == "running" and m.get("step", 0) >= min_step for m in markers)


def _job_ended(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout
    return not out.strip()


def _starts(run_dir: Path) -> list[str]:
    return [
        line
        for path in (run_dir / "logs").glob("attempt-*.out")
        for line in path.read_text().splitlines()
        if re.match(r"attempt \d+: (starting|resuming)", line)
    ]


def test_ray_sweep_in_an_allocation_survives_its_scancel(tmp_path: Path, repo_root: Path):
    grid = yaml.safe_load((repo_root / "tests" / "grids" / "resume.yaml").read_text())
    # Long enough that a quiet machine (~400 steps/s) is still mid-sweep at the scancel.
    grid["base"]["train"]["steps"] = 8000
    grid_path = tmp_path / "ray_grid.yaml"
    grid_path.write_text(yaml.safe_dump(grid))
    sweep_dir = tmp_path / "sweep"
    jobs = [_sbatch(repo_root, tmp_path, grid_path, sweep_dir)]
    try:
        # The runs' own markers, polled directly: a status process per poll is too slow.
        wait_until(lambda: _any_training(sweep_dir, 100), TIMEOUT_S, "a run training inside Ray")
        subprocess.run(["scancel", jobs[0]], check=True)
        wait_until(lambda: _job_ended(jobs[0]), 120, "the allocation to end")
        # The driver died with the allocation: no run may still read as running.
        wait_until(
            lambda: all(r["state"] != "running" for r in _rows(sweep_dir).values()),
            60,
            "no run shown as running after the driver was killed",
        )
        before = _rows(sweep_dir)
        finished = {
            rid: (sweep_dir / "runs" / rid / "summary.json").stat().st_mtime_ns
            for rid, r in before.items()
            if r["state"] == "done"
        }
        assert len(finished) < len(before), "the scancel came too late to interrupt the sweep"
        jobs.append(_sbatch(repo_root, tmp_path, grid_path, sweep_dir))
        wait_until(lambda: _job_ended(jobs[1]), TIMEOUT_S, "the second allocation to finish")
    finally:
        subprocess.run(["scancel", *jobs], check=False)

    rows = _rows(sweep_dir)
    assert {r["state"] for r in rows.values()} == {"done"}, rows
    for run_id, mtime in finished.items():
        summary = sweep_dir / "runs" / run_id / "summary.json"
        assert summary.stat().st_mtime_ns == mtime, f"{run_id} was trained again"
    for run_id in rows:
        starts = _starts(sweep_dir / "runs" / run_id)
        # Each run started from scratch once; an interrupted one resumed from its checkpoint.
        assert sum("starting" in line for line in starts) == 1, (run_id, starts)
