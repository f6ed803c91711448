"""Crash-retry budget: crashes are resubmitted launch.max_retries times, preemptions and
vanished (stale) runs always, without spending the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import sweep.launch as launch_module
from sweep.launch import LaunchOptions, launch
from sweep.retries import RETRIES_FILE

GRID = """\
name: retries
base: {model: {vocab_size: 64, seq_len: 16, head_dim: 16, d_model: 16},
       train: {batch_size: 2, steps: 3}}
axes: {seed: [0, 1, 2]}
launch: {executor: local, max_retries: %d}
"""


class FakeExecutor:
    """Records what a launch submits; runs nothing."""

    def __init__(self):
        self.rounds: list[list[str]] = []

    def submit(self, run_dirs, attempts):
        self.rounds.append(sorted(d.name for d in run_dirs))
        return []


@pytest.fixture
def fake(monkeypatch):
    executor = FakeExecutor()
    monkeypatch.setattr(launch_module, "make_executor", lambda *args: executor)
    return executor


def _end(run_dir: Path, state: str, attempt: int, **extra) -> None:
    marker = {"state": state, "step": 1, "attempt": attempt, **extra}
    (run_dir / "state.json").write_text(json.dumps(marker))


def _launch_and_end(grid, sweep_dir, fake, attempt):
    """One launch, then the runs end: seed 0 crashes, seed 1 is preempted, seed 2 vanishes."""
    result = launch(grid, sweep_dir, LaunchOptions())
    by_seed = {s.seed: sweep_dir / "runs" / s.run_id for s in result.expansion.runs}
    _end(by_seed[0], "failed", attempt, reason=f"RuntimeError: boom {attempt}")
    _end(by_seed[1], "preempted", attempt)
    # A running marker whose process is gone: stale (a node failure looks the same).
    _end(by_seed[2], "running", attempt, heartbeat=0.0, host="elsewhere", pid=1)
    return by_seed


@pytest.mark.parametrize("max_retries", [1, 2])
def test_crashes_spend_the_budget_preemptions_do_not(tmp_path, fake, max_retries):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID % max_retries)
    sweep_dir = tmp_path / "sweep"
    by_seed = _launch_and_end(grid, sweep_dir, fake, 1)
    for launch_no in range(2, max_retries + 3):
        _launch_and_end(grid, sweep_dir, fake, launch_no)
    crashed, preempted, vanished = (by_seed[s].name for s in (0, 1, 2))
    # Launch 1 submits all; the next max_retries launches retry the crash too; after that
    # the crash is left alone while the preempted and vanished runs keep being resubmitted.
    assert fake.rounds[0] == sorted([crashed, preempted, vanished])
    for round_ in fake.rounds[1 : max_retries + 1]:
        assert round_ == sorted([crashed, preempted, vanished])
    assert fake.rounds[max_retries + 1] == sorted([preempted, vanished])
    retries = json.loads((by_seed[0] / RETRIES_FILE).read_text())
    assert retries["crash_retries"] == max_retries
    assert [h["reason"] for h in retries["history"]] == [
        f"RuntimeError: boom {i}" for i in range(1, max_retries + 1)
    ]
    assert not (by_seed[1] / RETRIES_FILE).exists() and not (by_seed[2] / RETRIES_FILE).exists()
    # It stays failed with its cause.
    marker = json.loads((by_seed[0] / "state.json").read_text())
    assert marker["state"] == "failed" and marker["reason"].startswith("RuntimeError: boom")


def test_zero_retries_leaves_crashes_for_retry_failed(tmp_path, fake):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID % 0)
    sweep_dir = tmp_path / "sweep"
    by_seed = _launch_and_end(grid, sweep_dir, fake, 1)
    launch(grid, sweep_dir, LaunchOptions())
    assert by_seed[0].name not in fake.rounds[1]
    launch(grid, sweep_dir, LaunchOptions(retry_failed=True))
    assert by_seed[0].name in fake.rounds[2]
    assert not (by_seed[0] / RETRIES_FILE).exists()  # asked for: not counted
