"""`sweep cancel`: stop queued/running runs through their executor and mark them cancelled."""

from __future__ import annotations

import contextlib
import os
import signal

from models.atomic import atomic_write_json
from sweep.errors import SweepError
from sweep.store import CANCEL_FILE, RunRecord, SweepStore

ACTIVE = ("queued", "running")


def cancel_runs(store: SweepStore, run_ids: list[str] | None) -> list[RunRecord]:
    """Cancel the named (default: all) active runs; return the ones cancelled."""
    from sweep.reconcile import current_records

    records = current_records(store)
    if run_ids:
        known = {r.run_id for r in records}
        unknown = [rid for rid in run_ids if rid not in known]
        if unknown:
            raise SweepError(f"{store.root}: unknown run id(s) {', '.join(unknown)}")
        records = [r for r in records if r.run_id in run_ids]
    active = [r for r in records if r.state in ACTIVE and r.submission]
    slurm = [r.submission for r in active if r.submission.executor == "slurm"]
    if slurm:
        from sweep.executors.slurm import SlurmExecutor

        SlurmExecutor(store.root).cancel(slurm)
    for record in active:
        # The request file tells a run that receives SIGTERM to stop as cancelled, not preempted.
        atomic_write_json(record.run_dir / CANCEL_FILE, {"attempt": record.attempt})
        if record.submission.executor != "slurm":
            _signal_local(record)
        marker = dict(record.marker or {})
        marker.update(
            {
                "state": "cancelled",
                "attempt": record.attempt,
                "reason": "cancelled by `sweep cancel`",
            }
        )
        atomic_write_json(record.run_dir / "state.json", marker)
    return active


def _signal_local(record: RunRecord) -> None:
    """SIGTERM a local run's process: it checkpoints and stops."""
    pid = (record.marker or {}).get("pid")
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)
