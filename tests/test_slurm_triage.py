"""Triage, retries and hung runs of real training runs on a real SLURM: a crash is grouped
by its exception in `sweep status --failures` and retried launch.max_retries times; a run
alive without heartbeats is `hung` and `sweep cancel --hung` scancels it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from executor_fixtures import requires_slurm, wait_until

import sweep.launch as launch_module
from runfolder.atomic import read_json
from sweep.launch import LaunchOptions, launch
from sweep.retries import RETRIES_FILE

pytestmark = [pytest.mark.slurm, pytest.mark.slow, requires_slurm]
SWEEP = [sys.executable, "-m", "sweep.cli"]
TIMEOUT_S = 300
HUNG_AFTER_S = 8  # above the run's 5 s heartbeat period


def _grid(repo_root: Path, tmp_path: Path, name: str, seeds: int, **base) -> Path:
    grid = yaml.safe_load((repo_root / "tests" / "grids" / "resume.yaml").read_text())
    grid["name"] = name
    grid["axes"]["seed"] = list(range(seeds))
    for key, value in base.items():
        grid["base"][key] = value
    grid["launch"] = {"executor": "slurm", "max_retries": 1}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*SWEEP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def _markers(sweep_dir: Path) -> list[dict]:
    return [read_json(p) or {} for p in sorted(sweep_dir.glob("runs/*/state.json"))]


def _all_failed(sweep_dir: Path, attempt: int, runs: int) -> bool:
    markers = _markers(sweep_dir)
    return len(markers) == runs and all(
        m.get("state") == "failed" and m.get("attempt") == attempt for m in markers
    )


def test_crash_is_triaged_by_cause_and_retried_once(
    tmp_path: Path, repo_root: Path, monkeypatch: pytest.MonkeyPatch
):
    # Token files that vanished after the launch checked them (preflight is skipped here):
    # every run crashes in training with the same FileNotFoundError.
    missing = tmp_path / "moved" / "train.bin"
    data = {"kind": "tokens", "train": [str(missing)], "validation": [str(missing)]}
    grid = _grid(repo_root, tmp_path, "crash", 2, data=data)
    monkeypatch.setattr(launch_module, "preflight", lambda *args, **kwargs: None)
    sweep_dir = tmp_path / "crash"
    try:
        first = launch(grid, sweep_dir, LaunchOptions())
        assert len(first.submissions) == 2
        wait_until(lambda: _all_failed(sweep_dir, 1, 2), TIMEOUT_S, "both runs crash")
        # A plain launch retries each crash once (launch.max_retries: 1) ...
        second = launch(grid, sweep_dir, LaunchOptions())
        assert sorted(s.attempt for s in second.submissions) == [2, 2]
        wait_until(lambda: _all_failed(sweep_dir, 2, 2), TIMEOUT_S, "both retries crash")
        # ... and not again: the budget is spent, the runs stay failed.
        third = launch(grid, sweep_dir, LaunchOptions())
        assert third.submissions == [] and third.skipped == {"failed": 2}
    finally:
        subprocess.run(["scancel", "--name", f"sweep-{sweep_dir.name}"], check=False)
    for run_dir in (sweep_dir / "runs").iterdir():
        retries = json.loads((run_dir / RETRIES_FILE).read_text())
        assert retries["crash_retries"] == 1
        assert retries["history"][0]["reason"].startswith("FileNotFoundError")

    result = _cli("status", str(sweep_dir), "--failures", "--json", cwd=repo_root)
    assert result.returncode == 0, result.stderr
    groups = json.loads(result.stdout)["groups"]
    assert len(groups) == 1, groups
    [group] = groups
    assert (group["state"], group["count"]) == ("failed", 2)
    # The path differs per sweep, so it is masked: the cause reads the same for all runs.
    assert group["cause"] == "FileNotFoundError: token file <path> does not exist", group
    assert "attempt-2" in group["log_file"] and group["log_tail"], group
    table = _cli("status", str(sweep_dir), "--failures", cwd=repo_root)
    assert "2 run(s) in trouble, 1 cause(s)" in table.stdout


def _job_alive(name: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True, text=True)
    return bool(out.stdout.split())


def test_hung_slurm_run_is_shown_and_cancelled(tmp_path: Path, repo_root: Path):
    grid = _grid(
        repo_root,
        tmp_path,
        "hung",
        1,
        train={
            **yaml.safe_load((repo_root / "tests" / "grids" / "resume.yaml").read_text())["base"][
                "train"
            ],
            "steps": 100_000,
        },
    )
    sweep_dir = tmp_path / "hung"
    name = f"sweep-{sweep_dir.name}"
    pid = None
    try:
        launched = _cli("launch", str(grid), "--sweep-dir", str(sweep_dir), cwd=repo_root)
        assert launched.returncode == 0, launched.stdout + launched.stderr

        def training() -> bool:
            markers = _markers(sweep_dir)
            return (
                bool(markers)
                and markers[0].get("state") == "running"
                and (markers[0].get("step", 0) >= 5)
            )

        wait_until(training, TIMEOUT_S, "the run trains")
        pid = int(_markers(sweep_dir)[0]["pid"])
        os.kill(pid, signal.SIGSTOP)  # alive, but no step and no heartbeat any more
        stopped_at = time.time()

        def row() -> dict:
            args = ("status", str(sweep_dir), "--json", "--hung-after", str(HUNG_AFTER_S))
            result = _cli(*args, cwd=repo_root)
            assert result.returncode == 0, result.stderr
            return json.loads(result.stdout)["runs"][0]

        heartbeat = _markers(sweep_dir)[0]["heartbeat"]
        time.sleep(max(0.0, heartbeat + HUNG_AFTER_S + 1 - time.time()))
        assert row()["state"] == "hung", f"stopped {time.time() - stopped_at:.0f} s ago"
        failures = _cli(
            "status",
            str(sweep_dir),
            "--failures",
            "--json",
            "--hung-after",
            str(HUNG_AFTER_S),
            cwd=repo_root,
        )
        [group] = json.loads(failures.stdout)["groups"]
        assert group["state"] == "hung" and "no progress since step" in group["cause"]

        cancel = _cli(
            "cancel", str(sweep_dir), "--hung", "--hung-after", str(HUNG_AFTER_S), cwd=repo_root
        )
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        assert "cancelled 1 run(s)" in cancel.stdout
        wait_until(lambda: not _job_alive(name), 60, "scancel ends the hung job")
        # scancel's SIGCONT + SIGTERM may let the run record its cancellation itself.
        assert row()["state"] == "cancelled"
    finally:
        subprocess.run(["scancel", "--name", name], check=False)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
