"""The small interface every executor implements (its Submission record: runfolder.records)."""

from __future__ import annotations

import ctypes
import signal
import sys
from pathlib import Path
from typing import Protocol

from runfolder.records import Submission

_PR_SET_PDEATHSIG = 1

# What the scheduler can tell about a submitted run; run markers say the rest.
SCHEDULER_STATES = ("queued", "running", "gone", "cancelled", "unknown")
# What a job passes to the run it starts: its submission token and attempt, which the run
# checks against submitted.json before training (sweep.journal).
TOKEN_ENV = "MXSCALE_SUBMISSION"
ATTEMPT_ENV = "MXSCALE_ATTEMPT"


class Executor(Protocol):
    """Submit run folders, ask the scheduler about them, cancel them."""

    name: str

    def submit(self, run_dirs: list[Path], attempts: dict[str, int]) -> list[Submission]:
        """Start (or queue) each run folder; return one Submission per run."""

    def query(self, submissions: list[Submission]) -> dict[str, str]:
        """Map run_id to one of SCHEDULER_STATES for runs the scheduler may still hold."""

    def cancel(self, submissions: list[Submission]) -> None:
        """Stop these runs if queued or running."""


def run_command(run_dir: Path) -> list[str]:
    """The single entry point every executor runs for a run folder."""
    return [sys.executable, "-m", "sweep.run", str(run_dir)]


def die_with_parent() -> None:
    """``preexec_fn`` for a child that must not outlive its launcher (e.g. after SIGKILL)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
