"""The crash-retry budget: how often a launch resubmits a run that crashed.

A crash (the run itself ended ``failed``) is resubmitted by a plain `sweep launch` at most
``launch.max_retries`` times; each resubmission is counted, with the cause it retried, in
the run's ``retries.json``. Preemptions and node failures do not count: those runs end
``preempted`` or ``stale`` (the process or job vanished), which every launch resubmits
anyway. `--retry-failed` is the user asking and is not counted either.
"""

from __future__ import annotations

import time

from runfolder.atomic import atomic_write_json, read_json
from sweep.store import RunRecord

RETRIES_FILE = "retries.json"


def crash_retries(record: RunRecord) -> int:
    """How many times launches have resubmitted this run after a crash."""
    return int((read_json(record.run_dir / RETRIES_FILE) or {}).get("crash_retries", 0))


def crash_retry_due(record: RunRecord, max_retries: int) -> bool:
    """A crashed run whose retry budget is not spent yet."""
    return record.state == "failed" and crash_retries(record) < max_retries


def note_crash_retry(record: RunRecord) -> None:
    """Count one crash resubmission (call before submitting it), keeping the cause."""
    path = record.run_dir / RETRIES_FILE
    payload = read_json(path) or {"crash_retries": 0, "history": []}
    payload["crash_retries"] = int(payload.get("crash_retries", 0)) + 1
    payload.setdefault("history", []).append(
        {
            "attempt": record.attempt,
            "reason": (record.marker or {}).get("reason"),
            "retried_at": time.time(),
        }
    )
    atomic_write_json(path, payload)
