"""No run lost or duplicated when a local launch is interrupted, killed or raced."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow
LAUNCH = [sys.executable, "-m", "sweep.cli", "launch"]


def start_launch(grid: Path, sweep_dir: Path, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*LAUNCH, str(grid), "--sweep-dir", str(sweep_dir)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def wait_for_progress(sweep_dir: Path, min_step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for marker in sweep_dir.glob("runs/*/state.json"):
            state = json.loads(marker.read_text())
            if state["state"] == "running" and state["step"] >= min_step:
                return
        time.sleep(0.2)
    raise AssertionError("no run made progress in time")


def check_complete_and_unique(sweep_dir: Path) -> dict[str, dict]:
    summaries = {}
    for run_dir in sorted((sweep_dir / "runs").iterdir()):
        spec = json.loads((run_dir / "spec.json").read_text())
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["state"] == "done"
        table = pq.read_table(run_dir / "metrics").to_pandas()
        steps = table[table["name"] == "train/loss"]["step"]
        assert steps.is_unique, f"duplicated metric rows in {run_dir.name}"
        every, total = spec["train"]["log_every"], spec["train"]["steps"]
        assert set(steps) == {1, *range(every, total + 1, every)}, f"lost rows in {run_dir.name}"
        summaries[run_dir.name] = summary
    return summaries


def test_interrupted_launch_resumes_without_loss_or_duplicates(tmp_path, repo_root):
    grid = repo_root / "tests" / "grids" / "resume.yaml"
    sweep_dir = tmp_path / "sweep"
    proc = start_launch(grid, sweep_dir, repo_root)
    wait_for_progress(sweep_dir, min_step=1)
    os.killpg(proc.pid, signal.SIGTERM)  # what a scheduler or Ctrl-C does to the group
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    states = [json.loads(p.read_text())["state"] for p in sweep_dir.glob("runs/*/state.json")]
    assert "preempted" in states, states

    again = subprocess.run(
        [*LAUNCH, str(grid), "--sweep-dir", str(sweep_dir)],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    summaries = check_complete_and_unique(sweep_dir)
    assert len(summaries) == 4

    # The interrupted-and-resumed run ends exactly where an uninterrupted one does.
    resumed = next(
        p.parent
        for p in sweep_dir.glob("runs/*/checkpoints")
        if json.loads((p.parent / "submitted.json").read_text())["attempt"] == 2
    )
    fresh = tmp_path / "fresh" / resumed.name
    fresh.mkdir(parents=True)
    shutil.copy(resumed / "spec.json", fresh / "spec.json")
    subprocess.run(
        [sys.executable, "-m", "sweep.run", str(fresh)], cwd=repo_root, check=True, timeout=300
    )
    expected = json.loads((fresh / "summary.json").read_text())
    assert summaries[resumed.name]["final_val_loss"] == expected["final_val_loss"]
    assert summaries[resumed.name]["final_train_loss"] == expected["final_train_loss"]


def test_killed_launch_and_racing_launches_run_each_run_once(tmp_path, repo_root):
    grid = repo_root / "tests" / "grids" / "resume.yaml"
    sweep_dir = tmp_path / "sweep"
    proc = start_launch(grid, sweep_dir, repo_root)
    wait_for_progress(sweep_dir, min_step=1)
    os.killpg(proc.pid, signal.SIGKILL)  # no chance to checkpoint or clean up
    proc.wait(timeout=30)

    racers = [start_launch(grid, sweep_dir, repo_root) for _ in range(2)]
    outputs = [r.communicate(timeout=600)[0] for r in racers]
    assert all(r.returncode == 0 for r in racers), outputs
    submitted = sum(int(o.split("submitted ")[1].split()[0]) for o in outputs)
    assert submitted == 4, outputs  # the four killed runs, each by exactly one launcher
    check_complete_and_unique(sweep_dir)
    for path in sweep_dir.glob("runs/*/submitted.json"):
        assert json.loads(path.read_text())["attempt"] == 2
