"""Reconcile run markers with the scheduler: one query for all runs their files call active."""

from __future__ import annotations

import shutil

from sweep.store import RunRecord, SweepStore, with_scheduler

ASK_SCHEDULER = ("queued", "running", "stale", "preempted")


def current_records(store: SweepStore) -> list[RunRecord]:
    """All runs, with SLURM asked (once) about the ones whose files say they are active."""
    records = store.records()
    slurm = [
        r.submission
        for r in records
        if r.submitted and r.submitted.get("executor") == "slurm" and r.state in ASK_SCHEDULER
    ]
    if slurm and shutil.which("squeue"):
        from sweep.executors.slurm import SlurmExecutor, run_answer

        with_scheduler(records, SlurmExecutor(store.root).query(slurm, run_answer))
    return records
