"""Run state derivation, the sweep-folder lock and grid-change protection."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from sweep.store import STALE_AFTER_S, SweepError, SweepStore, derive_state

HOST = socket.gethostname()
NOW = 1_000_000.0


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(
    ("marker", "submitted", "scheduler", "expected"),
    [
        (None, None, None, "pending"),
        (None, {"executor": "slurm", "attempt": 1}, "queued", "queued"),
        (None, {"executor": "slurm", "attempt": 1}, "gone", "stale"),
        ({"state": "done", "attempt": 1}, {"executor": "slurm", "attempt": 1}, "gone", "done"),
        ({"state": "diverged", "attempt": 1}, None, None, "diverged"),
        ({"state": "failed", "attempt": 1}, {"executor": "slurm", "attempt": 1}, None, "failed"),
        # A newer attempt was submitted after the failure: it is queued again.
        (
            {"state": "failed", "attempt": 1},
            {"executor": "slurm", "attempt": 2},
            "queued",
            "queued",
        ),
        (
            {"state": "running", "heartbeat": NOW - 5, "attempt": 1, "host": "elsewhere", "pid": 1},
            {"executor": "slurm", "attempt": 1},
            None,
            "running",
        ),
        (
            {"state": "running", "heartbeat": NOW - 5, "attempt": 1, "host": "elsewhere", "pid": 1},
            {"executor": "slurm", "attempt": 1},
            "gone",
            "stale",
        ),
        (
            {
                "state": "running",
                "heartbeat": NOW - STALE_AFTER_S - 1,
                "attempt": 1,
                "host": "elsewhere",
            },
            {"executor": "slurm", "attempt": 1},
            None,
            "stale",
        ),
        (
            {"state": "preempted", "attempt": 1},
            {"executor": "slurm", "attempt": 1},
            "queued",
            "queued",
        ),
        (
            {"state": "preempted", "attempt": 1},
            {"executor": "local", "attempt": 1},
            None,
            "preempted",
        ),
    ],
)
def test_derive_state(marker, submitted, scheduler, expected):
    assert derive_state(marker, submitted, scheduler, NOW) == expected


def test_local_run_with_dead_process_is_stale():
    pid = dead_pid()
    marker = {"state": "running", "heartbeat": time.time(), "attempt": 1, "host": HOST, "pid": pid}
    assert derive_state(marker, None, None, time.time()) == "stale"
    marker["pid"] = os.getpid()
    assert derive_state(marker, None, None, time.time()) == "running"
    submitted = {"executor": "local", "attempt": 1, "host": HOST, "pid": pid}
    assert derive_state(None, submitted, None, time.time()) == "stale"


def test_changed_grid_is_refused_unless_update(tmp_path):
    store = SweepStore(tmp_path / "s")
    store.initialise("a: 1\n", ["r1", "r2"], update_grid=False)
    store.initialise("a: 1  # comment\n", ["r2", "r1"], update_grid=False)  # same runs
    with pytest.raises(SweepError, match="1 runs added, 1 removed"):
        store.initialise("a: 2\n", ["r1", "r3"], update_grid=False)
    store.initialise("a: 2\n", ["r1", "r3"], update_grid=True)
    assert store.run_ids() == ["r1", "r3"]


def test_lock_serialises_launchers(tmp_path):
    store = SweepStore(tmp_path / "s")
    order = []

    def hold():
        with store.lock():
            order.append("a-in")
            time.sleep(0.5)
            order.append("a-out")

    thread = threading.Thread(target=hold)
    thread.start()
    time.sleep(0.1)
    with SweepStore(tmp_path / "s").lock():
        order.append("b-in")
    thread.join()
    assert order == ["a-in", "a-out", "b-in"]
    # flock is per open file description: a second open of the file conflicts.
    with (
        store.lock(),
        pytest.raises(SweepError, match="holds the lock"),
        SweepStore(tmp_path / "s").lock(timeout_s=0.3),
    ):
        pass
