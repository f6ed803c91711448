"""Ray executor against a real local Ray: trials run the command, failures are reported."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from executor_fixtures import FAILING, QUICK, fake_command, make_run_dirs, wait_until

from sweep.executors.ray_exec import RayExecutor


def _descendants(pid: int) -> set[int]:
    """Live descendant pids of pid, from /proc (the parent pid is field 4 of /proc/<pid>/stat)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # exited while we looked
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="num_cpus must be >= 1, got 0"):
        RayExecutor(num_cpus=0)
    with pytest.raises(ValueError, match="cpus_per_run must be > 0, got 0"):
        RayExecutor(cpus_per_run=0)
    with pytest.raises(ValueError, match="num_cpus only applies to a local Ray"):
        RayExecutor(address="auto", num_cpus=2)


def test_empty_submit_starts_nothing():
    assert RayExecutor().submit([], {}) == []


@pytest.mark.slow
def test_runs_complete_and_a_failing_command_is_reported(tmp_path: Path):
    runs = make_run_dirs(tmp_path, 3)
    bad = tmp_path / "runs" / "bad"
    bad.mkdir()
    quick, failing = fake_command(QUICK), fake_command(FAILING)
    events: list[tuple[str, str]] = []
    lock = threading.Lock()  # like a live console, it cannot be pickled; Tune must not try

    def record(event: str, run_id: str, outcome: None) -> None:
        with lock:
            events.append((event, run_id))

    executor = RayExecutor(
        num_cpus=2,
        command=lambda d: failing(d) if d.name == "bad" else quick(d),
        on_event=record,
    )

    before = _descendants(os.getpid())
    subs = executor.submit([*runs, bad], {"run0": 1, "run1": 1, "run2": 1, "bad": 4})

    assert [sub.run_id for sub in subs] == ["run0", "run1", "run2", "bad"]
    assert [sub.attempt for sub in subs] == [1, 1, 1, 4]
    trial_ids = [sub.job_id for sub in subs]
    assert all(trial_ids) and len(set(trial_ids)) == 4, trial_ids
    assert [(d / "done").read_text() for d in runs] == ["x"] * 3, "each run ran exactly once"
    assert (runs[1] / "logs" / "attempt-1.out").read_text() == "ran run1\n"

    assert {run: outcome.status for run, outcome in executor.outcomes.items()} == {
        "run0": "done",
        "run1": "done",
        "run2": "done",
        "bad": "failed",
    }
    assert "exited with 3" in executor.outcomes["bad"].error
    assert executor.outcomes["bad"].trial_id == subs[3].job_id
    assert (bad / "logs" / "attempt-4.err").read_text() == "boom\n"
    assert executor.query(subs) == dict.fromkeys(["run0", "run1", "run2", "bad"], "gone")
    # Each trial's end was reported once, as it happened (order depends on scheduling).
    assert sorted(events) == [
        ("done", "run0"),
        ("done", "run1"),
        ("done", "run2"),
        ("failed", "bad"),
    ]

    # ray.shutdown stops the local cluster this process started: no raylet/GCS left behind.
    wait_until(lambda: _descendants(os.getpid()) <= before, 15, "Ray processes to exit")
