"""Run states derived from the files of a run folder, case by case, as the README defines
them: a terminal marker wins; a newer submission than the marker's attempt means the run
is queued again; a running marker with a fresh heartbeat and a live process is running,
else stale; a preempted run the scheduler holds again is queued."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from sweep.store import STALE_AFTER_S, derive_state

NOW = 1_000_000.0
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def marker(state: str, attempt: int = 1, age_s: float = 1.0, pid: int | None = None) -> dict:
    return {
        "state": state,
        "attempt": attempt,
        "heartbeat": NOW - age_s,
        "host": HOST,
        "pid": os.getpid() if pid is None else pid,
    }


def submitted(attempt: int = 1, executor: str = "slurm", pid: int | None = None) -> dict:
    return {"attempt": attempt, "executor": executor, "host": HOST, "pid": pid or os.getpid()}


@pytest.mark.parametrize("state", ["done", "diverged"])
def test_terminal_markers_win_over_everything(state):
    assert derive_state(marker(state), submitted(attempt=2), "running", NOW) == state


def test_nothing_written_is_pending_and_a_submission_alone_is_queued():
    assert derive_state(None, None, None, NOW) == "pending"
    assert derive_state(None, submitted(), None, NOW) == "queued"
    assert derive_state(None, submitted(), "gone", NOW) == "stale"


def test_running_needs_a_fresh_heartbeat_and_a_live_process(dead_pid):
    assert derive_state(marker("running"), submitted(), None, NOW) == "running"
    old = marker("running", age_s=STALE_AFTER_S + 1)
    assert derive_state(old, submitted(), None, NOW) == "stale"
    assert derive_state(marker("running", pid=dead_pid), submitted(), None, NOW) == "stale"
    # The scheduler's word wins over the heartbeat.
    assert derive_state(old, submitted(), "running", NOW) == "running"
    assert derive_state(marker("running"), submitted(), "gone", NOW) == "stale"


def test_a_preempted_run_the_scheduler_holds_again_is_queued():
    assert derive_state(marker("preempted"), submitted(), "queued", NOW) == "queued"
    assert derive_state(marker("preempted"), submitted(), "running", NOW) == "queued"
    assert derive_state(marker("preempted"), submitted(), None, NOW) == "preempted"


@pytest.mark.parametrize("state", ["failed", "cancelled", "preempted"])
def test_a_newer_submission_than_the_markers_attempt_is_queued(state):
    assert derive_state(marker(state, attempt=1), submitted(attempt=2), None, NOW) == "queued"
    assert derive_state(marker(state, attempt=2), submitted(attempt=2), None, NOW) == state
