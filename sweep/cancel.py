"""`sweep cancel`: stop queued/running runs through their executor and mark them cancelled."""

from __future__ import annotations

import contextlib
import os
import signal

from runfolder.records import write_cancel, write_state
from sweep.errors import SweepError
from sweep.store import RunRecord, SweepStore

ACTIVE = ("queued", "running")


def cancel_runs(
    store: SweepStore, run_ids: list[str] | None, hung_after_s: float | None = None
) -> list[RunRecord]:
    """Cancel the named (default: all) active runs; return the ones cancelled. With
    ``hung_after_s``, only the hung ones (alive, no heartbeat for that long): they are
    killed outright, since a run that makes no progress never reaches its checkpoint."""
    import time

    from sweep.reconcile import current_records
    from sweep.triage import mark_hung

    records = current_records(store)
    if hung_after_s is not None:
        mark_hung(records, hung_after_s, time.time())
    if run_ids:
        known = {r.run_id for r in records}
        unknown = [rid for rid in run_ids if rid not in known]
        if unknown:
            raise SweepError(f"{store.root}: unknown run id(s) {', '.join(unknown)}")
        records = [r for r in records if r.run_id in run_ids]
    wanted = ("hung",) if hung_after_s is not None else ACTIVE
    active = [r for r in records if r.state in wanted and r.submission]
    slurm = [r.submission for r in active if r.submission.executor == "slurm"]
    if slurm:
        from sweep.executors.slurm import SlurmExecutor

        SlurmExecutor(store.root).cancel(slurm)
    for record in active:
        hung = record.state == "hung"
        reason = "cancelled by `sweep cancel`"
        if hung:
            reason = f"hung at step {record.step} (no heartbeat); killed by `sweep cancel --hung`"
        # The request tells a run that receives SIGTERM to stop as cancelled, not preempted,
        # and makes the store read the run as cancelled until the run records it itself.
        write_cancel(record.run_dir, record.attempt, reason)
        if record.submission.executor != "slurm":
            _signal_local(record, signal.SIGKILL if hung else signal.SIGTERM)
        if hung:  # killed outright: the run cannot write its own final marker
            marker = {**(record.marker or {}), "state": "cancelled", "attempt": record.attempt}
            write_state(record.run_dir, {**marker, "reason": reason})
    return active


def _signal_local(record: RunRecord, signum: int = signal.SIGTERM) -> None:
    """Signal a local run's process: SIGTERM checkpoints and stops it, SIGKILL ends it."""
    pid = (record.marker or {}).get("pid")
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signum)
