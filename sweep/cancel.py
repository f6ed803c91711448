"""`sweep cancel`: stop queued/running runs through their executor and mark them cancelled."""

from __future__ import annotations

from runfolder.records import write_cancel, write_state
from sweep.errors import SweepError
from sweep.executors import registry
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
    by_executor: dict[str, list[RunRecord]] = {}
    for record in active:
        # The request tells a run that receives SIGTERM to stop as cancelled, not preempted,
        # and makes the store read the run as cancelled until the run records it itself.
        write_cancel(record.run_dir, record.attempt, _reason(record))
        by_executor.setdefault(record.submission.executor, []).append(record)
    for name, group in by_executor.items():
        cls = registry.known(name)
        if cls is None:
            raise SweepError(f"{store.root}: runs submitted by unknown executor {name!r}")
        # A hung run makes no progress, so it never reaches a checkpoint: killed at once.
        kill = hung_after_s is not None
        cls.for_sweep(store.root).cancel([r.submission for r in group], kill=kill)
    for record in active:
        if record.state == "hung":  # killed outright: the run cannot write its own final marker
            marker = {**(record.marker or {}), "state": "cancelled", "attempt": record.attempt}
            write_state(record.run_dir, {**marker, "reason": _reason(record)})
    return active


def _reason(record: RunRecord) -> str:
    if record.state == "hung":
        return f"hung at step {record.step} (no heartbeat); killed by `sweep cancel --hung`"
    return "cancelled by `sweep cancel`"
