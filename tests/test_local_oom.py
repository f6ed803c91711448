"""A local run killed by SIGKILL mid-training (what the OOM killer does) ends failed with
the signal as its cause, not stale."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow
SWEEP = [sys.executable, "-m", "sweep.cli"]


def _one_long_run(repo_root: Path, tmp_path: Path) -> Path:
    grid = yaml.safe_load((repo_root / "tests" / "grids" / "micro.yaml").read_text())
    grid["axes"] = {"budget": [4.0e10], "shape": grid["axes"]["shape"][:1]}
    grid["base"]["precision"] = {"w_fmt": "bf16", "a_fmt": "bf16"}
    grid["launch"] = {"executor": "local", "workers": 1, "max_retries": 0}
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def _marker(sweep_dir: Path) -> dict | None:
    for path in sweep_dir.glob("runs/*/state.json"):
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return None
    return None


def test_sigkilled_local_run_is_failed_with_its_signal(tmp_path: Path, repo_root: Path):
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = subprocess.Popen(
        [*SWEEP, "launch", str(_one_long_run(repo_root, tmp_path)), "--sweep-dir", str(sweep_dir)],
        cwd=repo_root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not ((m := _marker(sweep_dir)) and m["state"] == "running" and m["step"] >= 5):
            assert launch.poll() is None, launch.stdout.read()
            assert time.monotonic() < deadline, "the run never made progress"
            time.sleep(0.2)
        os.kill(m["pid"], signal.SIGKILL)
        out, _ = launch.communicate(timeout=120)
    finally:
        if launch.poll() is None:
            launch.kill()
    assert launch.returncode == 3, out  # a blocking launch with a failed run
    status = subprocess.run(
        [*SWEEP, "status", str(sweep_dir), "--json"], env=env, capture_output=True, text=True
    )
    [row] = json.loads(status.stdout)["runs"]
    assert row["state"] == "failed", row
    assert row["reason"] == "killed by signal 9 (out of memory?)"
    failures = subprocess.run(
        [*SWEEP, "status", str(sweep_dir), "--failures", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    [group] = json.loads(failures.stdout)["groups"]
    assert (group["state"], group["cause"], group["count"]) == (
        "failed",
        "killed by signal 9 (out of memory?)",
        1,
    )
