"""The sweep folder: frozen grid, one folder per run, and run state derived from its files.

State lives only in files written atomically (the run-folder contract, runfolder: by the
launcher spec.json, submitted.json; by the run itself state.json, summary.json; by
`sweep cancel` cancel.json), so no long-lived driver holds it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runfolder.atomic import atomic_write_json, atomic_write_text, read_json
from runfolder.paths import RunPaths, checkpoint_steps
from runfolder.records import (
    TERMINAL_STATES,
    Submission,
    effective_marker,
    read_cancel,
    read_spec,
    read_state,
    read_submitted,
    read_summary,
    write_spec,
    write_submitted,
)
from sweep.errors import SweepError
from sweep.executors.registry import known

RUN_STATES = (
    "pending",
    "queued",
    "running",
    "done",
    "diverged",
    "failed",
    "cancelled",
    "preempted",
    "stale",
    "incomplete",
)
# States of a run that waits to continue: status shows the step it will resume from.
WAITING_STATES = ("queued", "stale", "preempted")
# A run whose heartbeat is older than this, and whose process or job is gone, is stale.
STALE_AFTER_S = 120.0


@dataclass
class RunRecord:
    """What the files of one run folder say, plus the derived state."""

    run_id: str
    run_dir: Path
    spec: dict[str, Any]
    state: str
    marker: dict[str, Any] | None
    submitted: dict[str, Any] | None
    summary: dict[str, Any] | None

    @property
    def submission(self) -> Submission | None:
        return Submission.from_json(self.submitted) if self.submitted else None

    @property
    def config(self) -> str:
        return self.spec.get("tags", {}).get("config", "?")

    @property
    def step(self) -> int:
        return int((self.marker or {}).get("step", 0))

    @property
    def resume_step(self) -> int:
        """The step the run continues from when it next starts: its newest checkpoint."""
        steps = checkpoint_steps(RunPaths(self.run_dir).checkpoints)
        return steps[-1] if steps else 0

    @property
    def total_steps(self) -> int:
        """Steps the spec asks for; 0 while the spec is missing (a launch was killed)."""
        train = self.spec.get("train")
        return int(train.get("steps", 0)) if isinstance(train, dict) else 0

    @property
    def attempt(self) -> int:
        return self.submission.attempt if self.submission else 0


class SweepStore:
    """Read and write one sweep folder."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.runs_dir = self.root / "runs"

    # -- creation -------------------------------------------------------------------------
    def initialise(self, grid_text: str, run_ids: list[str], *, update_grid: bool) -> None:
        """Freeze the grid into the folder; refuse a different grid unless ``update_grid``."""
        grid_hash = hashlib.sha256("\n".join(sorted(run_ids)).encode()).hexdigest()[:16]
        meta_path = self.root / "sweep.json"
        # An unreadable sweep.json (a killed writer on a filesystem without atomic rename)
        # is rewritten: the run folders, not this file, hold what ran.
        meta = read_json(meta_path)
        if meta is not None and "grid_hash" in meta:
            if meta["grid_hash"] != grid_hash and not update_grid:
                known = set(meta.get("run_ids", []))
                added = len(set(run_ids) - known)
                removed = len(known - set(run_ids))
                raise SweepError(
                    f"{self.root}: this sweep folder was launched with a different grid "
                    f"({added} runs added, {removed} removed). Use another --sweep-dir, or "
                    "pass --update-grid to extend this sweep (finished runs are kept)."
                )
        else:
            meta = {"created_at": time.time()}
        meta.update({"grid_hash": grid_hash, "run_ids": sorted(run_ids), "updated_at": time.time()})
        atomic_write_text(self.root / "grid.yaml", grid_text)
        atomic_write_json(meta_path, meta)

    def add_branches(self, run_ids: list[str]) -> None:
        """Register branched runs (``sweep intervene``) beside the grid's own runs."""
        meta = read_json(self.root / "sweep.json")
        if meta is None:
            raise SweepError(
                f"{self.root}: not a launched sweep (no readable sweep.json); launch it first"
            )
        meta["branch_ids"] = sorted(set(meta.get("branch_ids", [])) | set(run_ids))
        meta["updated_at"] = time.time()
        atomic_write_json(self.root / "sweep.json", meta)

    def write_spec(self, run_id: str, spec_json: str) -> Path:
        """Create the run folder with its spec (unchanged if a readable one exists)."""
        run_dir = self.runs_dir / run_id
        if read_spec(run_dir) is None:
            write_spec(run_dir, spec_json)
        return run_dir

    def record_submission(self, submission: Submission) -> None:
        write_submitted(self.runs_dir / submission.run_id, submission)

    @contextmanager
    def lock(self, *, timeout_s: float = 30.0) -> Iterator[None]:
        """Exclusive lock on the sweep folder so two launches cannot submit the same run."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as handle:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise SweepError(
                            f"{self.root}: another `sweep launch` holds the lock "
                            f"for more than {timeout_s:.0f} s"
                        ) from None
                    time.sleep(0.2)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- reading --------------------------------------------------------------------------
    def exists(self) -> bool:
        return (self.root / "sweep.json").exists()

    def run_ids(self) -> list[str]:
        """The sweep's runs per sweep.json (runs without a folder included), else the folders."""
        meta = read_json(self.root / "sweep.json")
        if meta is not None and isinstance(meta.get("run_ids"), list):
            return [str(r) for r in meta["run_ids"] + list(meta.get("branch_ids", []))]
        if not self.runs_dir.is_dir():
            return []
        return sorted(p.name for p in self.runs_dir.iterdir() if p.is_dir())

    def records(self) -> list[RunRecord]:
        """Every run of the sweep with the state its files alone imply."""
        now = time.time()
        return [self.record(run_id, now) for run_id in self.run_ids()]

    def record(self, run_id: str, now: float) -> RunRecord:
        """One run from its files; a file a killed writer left missing or unreadable counts as
        absent, a run whose spec is missing while other files exist is ``incomplete``, and
        an unfinished run whose current attempt was cancelled is ``cancelled``."""
        run_dir = self.runs_dir / run_id
        paths = RunPaths(run_dir)  # once: status builds these for every run of a big sweep
        spec = read_spec(paths) or {}
        submitted = read_submitted(paths)
        marker = effective_marker(read_state(paths), submitted, read_cancel(paths))
        summary = read_summary(paths)
        state = derive_state(marker, submitted, None, now)
        if not spec and state not in TERMINAL_STATES and (marker or submitted):
            state = "incomplete"
        return RunRecord(run_id, run_dir, spec, state, marker, submitted, summary)


def with_scheduler(records: list[RunRecord], scheduler: dict[str, str]) -> list[RunRecord]:
    """Re-derive the state of runs the scheduler answered for (queued|running|gone)."""
    now = time.time()
    for record in records:
        if record.run_id in scheduler and record.state != "incomplete":
            record.state = derive_state(
                record.marker, record.submitted, scheduler[record.run_id], now
            )
    return records


def derive_state(
    marker: dict | None, submitted: dict | None, scheduler: str | None, now: float
) -> str:
    """One run's state from its marker, its submission record and the scheduler's word."""
    if marker is not None:
        state = marker.get("state", "running")
        marker_attempt = marker.get("attempt", 0)
        newer_submission = submitted and submitted.get("attempt", 0) > marker_attempt
        if state in TERMINAL_STATES:
            return state
        if newer_submission:
            return _submitted_state(submitted, scheduler, now)
        if scheduler == "cancelled" and state in ("running", "preempted"):
            return "cancelled"  # a person's scancel, not the scheduler's preemption
        if state == "running":
            fresh = now - marker.get("heartbeat", 0.0) < STALE_AFTER_S
            if scheduler == "running" or (scheduler is None and fresh and _process_alive(marker)):
                return "running"
            if scheduler == "queued":  # requeued after preemption, not restarted yet
                return "queued"
            return "stale"
        if state == "preempted" and scheduler in ("queued", "running"):
            return "queued"
        return state
    if submitted is not None:
        return _submitted_state(submitted, scheduler, now)
    return "pending"


def _submitted_state(submitted: dict, scheduler: str | None, now: float) -> str:
    if scheduler in ("queued", "running"):
        return "queued"
    if scheduler == "cancelled":
        return "cancelled"
    if scheduler == "gone":
        return "stale"
    # No scheduler answer: a blocking launcher (local pool, Ray driver) holds its runs only
    # while its process lives; a Ray driver killed with its allocation leaves them stale.
    executor = known(submitted.get("executor"))
    if executor is not None and executor.tracks_pids:
        return "queued" if _process_alive(submitted) else "stale"
    return "queued"


def _process_alive(record: dict) -> bool:
    """True if the process named by ``record`` (pid on host) still runs, or cannot be checked."""
    if record.get("host") != socket.gethostname() or not record.get("pid"):
        return True
    pid = int(record["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A killed process whose parent died stays a zombie until init reaps it (slowly, in
    containers): it answers signals but will never write another marker."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"
