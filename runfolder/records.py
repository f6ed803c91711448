"""Typed records of the run-folder files, their readers and their one writer each.

Records are plain JSON objects; the TypedDicts name their keys. Readers tolerate old
folders: a missing key reads as its default, an unknown key is kept, and a file a killed
writer left missing or unreadable reads as None.

Who writes what: the launcher ``spec.json`` and ``submitted.json``; the run itself
``state.json`` and ``summary.json``; ``sweep cancel`` ``cancel.json`` (and ``state.json``
only for a run it killed outright, which cannot write its own).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from runfolder.atomic import atomic_write_json, atomic_write_text, read_json
from runfolder.paths import RunPaths

# States a run writes into its state.json; done and diverged are final.
MARKER_STATES = ("running", "done", "diverged", "failed", "cancelled", "preempted")
TERMINAL_STATES = ("done", "diverged")


# Keys summaries written before the run-folder contract copied from the spec. A summary
# holds results (and the run's id, kind, label and step target); write_summary leaves these
# out, readers take them from spec.json, and an old summary that still holds them loads
# the same. The trainer's in-memory summary (train_run's return) still carries them.
SUMMARY_FROM_SPEC = (
    "w_fmt",
    "a_fmt",
    "d_model",
    "n_layers",
    "lr",
    "seed",
    "budget",
    "parent",
    "branch_step",
    "arm",
)


class StateMarker(TypedDict, total=False):
    """state.json: the run's own word on itself (heartbeat while running)."""

    state: str
    step: int
    total_steps: int
    attempt: int
    heartbeat: float
    started_at: float
    last_loss: float | None
    first_step_at: float | None
    first_step: int | None  # with first_step_at: measured steps/s
    host: str
    pid: int  # rank 0's: a stop signal to it reaches every rank
    processes: int
    reason: str
    traceback: str


class CancelRequest(TypedDict, total=False):
    """cancel.json: ``sweep cancel`` asked attempts up to ``attempt`` to stop."""

    attempt: int
    reason: str
    requested_at: float


@dataclass
class Submission:
    """One attempt of one run handed to an executor (persisted as submitted.json)."""

    run_id: str
    executor: str
    job_id: str | None
    attempt: int
    submitted_at: float = field(default_factory=time.time)
    # The write-ahead token of the submission (sweep.journal); the job checks it.
    token: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: dict) -> Submission:
        return cls(
            **{
                k: payload[k]
                for k in ("run_id", "executor", "job_id", "attempt", "submitted_at", "token")
                if k in payload
            }
        )


def run_paths(run_dir: str | Path | RunPaths) -> RunPaths:
    """``run_dir`` as RunPaths."""
    return run_dir if isinstance(run_dir, RunPaths) else RunPaths(Path(run_dir))


# -- readers ------------------------------------------------------------------------------
def read_spec(run_dir: str | Path | RunPaths) -> dict[str, Any] | None:
    """spec.json as a mapping (a RunSpec's JSON), or None."""
    return read_json(run_paths(run_dir).spec)


def read_state(run_dir: str | Path | RunPaths) -> StateMarker | None:
    """state.json, or None while the run has not started."""
    return read_json(run_paths(run_dir).state)  # type: ignore[return-value]


def read_summary(run_dir: str | Path | RunPaths) -> dict[str, Any] | None:
    """summary.json (a finished run's results), or None."""
    return read_json(run_paths(run_dir).summary)


def read_submitted(run_dir: str | Path | RunPaths) -> dict[str, Any] | None:
    """submitted.json when it names its executor and attempt, else None (as if never
    written): the host and pid of the launcher come with the Submission's fields."""
    return valid_submission(read_json(run_paths(run_dir).submitted))


def valid_submission(payload: dict | None) -> dict | None:
    """A submitted.json payload that names its executor and attempt, else None."""
    if payload is None or not isinstance(payload.get("executor"), str):
        return None
    return payload if isinstance(payload.get("attempt"), int) else None


def read_cancel(run_dir: str | Path | RunPaths) -> CancelRequest | None:
    """cancel.json, or None when no cancel was asked for."""
    return read_json(run_paths(run_dir).cancel)  # type: ignore[return-value]


def cancel_applies(cancel: CancelRequest | None, attempt: int) -> bool:
    """True when a cancel request covers ``attempt`` (a later resubmission outlives it)."""
    return cancel is not None and int(cancel.get("attempt", 0)) >= attempt


def effective_marker(
    marker: StateMarker | None, submitted: dict | None, cancel: CancelRequest | None
) -> StateMarker | None:
    """The run's marker with an applicable cancel request folded in: a run not finished
    whose current attempt was cancelled reads as cancelled, with the request's reason."""
    attempt = max(int((submitted or {}).get("attempt", 0)), int((marker or {}).get("attempt", 0)))
    if not cancel_applies(cancel, attempt) or (marker or {}).get("state") in TERMINAL_STATES:
        return marker
    if marker is not None and marker.get("state") == "cancelled":
        return marker  # the run recorded its own stop (its step, its reason)
    return {
        **(marker or {}),
        "state": "cancelled",
        "attempt": attempt,
        "reason": cancel.get("reason", "cancelled by `sweep cancel`"),
    }


# -- writers ------------------------------------------------------------------------------
def write_spec(run_dir: str | Path | RunPaths, spec_json: str) -> Path:
    """Write spec.json (the launcher, once per run)."""
    return atomic_write_text(run_paths(run_dir).spec, spec_json)


def submitted_payload(submission: Submission) -> dict[str, Any]:
    """submitted.json's content: the submission and the launcher (host, pid) recording it."""
    return {**submission.to_json(), "host": socket.gethostname(), "pid": os.getpid()}


def write_submitted(run_dir: str | Path | RunPaths, submission: Submission) -> Path:
    """Write submitted.json for ``submission``, with the launcher's host and pid."""
    return atomic_write_json(run_paths(run_dir).submitted, submitted_payload(submission))


def write_state(run_dir: str | Path | RunPaths, marker: StateMarker) -> Path:
    """Write state.json (the run; `sweep cancel` only for a run it killed outright)."""
    return atomic_write_json(run_paths(run_dir).state, marker)


def write_summary(run_dir: str | Path | RunPaths, summary: dict[str, Any]) -> Path:
    """Write summary.json (the run, once it finished): its results only, the keys that are
    the spec's (SUMMARY_FROM_SPEC) left to spec.json."""
    results = {key: value for key, value in summary.items() if key not in SUMMARY_FROM_SPEC}
    return atomic_write_json(run_paths(run_dir).summary, results)


def write_cancel(run_dir: str | Path | RunPaths, attempt: int, reason: str) -> Path:
    """Ask attempts up to ``attempt`` of a run to stop as cancelled (cancel.json)."""
    request: CancelRequest = {"attempt": attempt, "reason": reason, "requested_at": time.time()}
    return atomic_write_json(run_paths(run_dir).cancel, request)
