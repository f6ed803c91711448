"""A launch's spec.json and submitted.json files, written as durable batches
(runfolder.durable) instead of one fsync each."""

from __future__ import annotations

from runfolder.durable import DurableBatch
from runfolder.paths import RunPaths
from runfolder.records import Submission, read_spec, submitted_payload
from sweep import faults
from sweep.store import SweepStore


def write_specs(store: SweepStore, specs: list[tuple[str, str]]) -> None:
    """Each run's spec.json ((run_id, JSON text)), left unchanged where a readable one
    exists, as one batch."""
    batch = DurableBatch()
    for run_id, spec_json in specs:
        paths = RunPaths(store.runs_dir / run_id)
        if read_spec(paths) is None:
            batch.write_text(paths.spec, spec_json)
        faults.passed("spec")
    batch.commit()


def record_submissions(store: SweepStore, submissions: list[Submission]) -> None:
    """Each submission's submitted.json, as one batch."""
    batch = DurableBatch()
    for submission in submissions:
        batch.write_json(
            RunPaths(store.runs_dir / submission.run_id).submitted, submitted_payload(submission)
        )
        faults.passed("submitted")
    batch.commit()
