"""Reconcile run markers with the scheduler: one query per executor for all runs their
files call active."""

from __future__ import annotations

from runfolder.records import Submission
from sweep.executors.registry import known
from sweep.store import RunRecord, SweepStore, with_scheduler

ASK_SCHEDULER = ("queued", "running", "stale", "preempted")


def current_records(store: SweepStore) -> list[RunRecord]:
    """All runs, with each executor's scheduler asked (once) about the ones whose files
    say they are active (executors whose runs are processes of this host answer nothing:
    the pids in the files decide, see sweep.store.derive_state)."""
    records = store.records()
    by_executor: dict[str, list[Submission]] = {}
    for record in records:
        if record.submission and record.state in ASK_SCHEDULER:
            by_executor.setdefault(record.submission.executor, []).append(record.submission)
    for name, submissions in by_executor.items():
        cls = known(name)
        if cls is not None:
            with_scheduler(records, cls.run_states(store.root, submissions))
    return records
