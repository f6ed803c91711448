"""Write-ahead submission journal: no sbatch without a record, so a killed launcher leaves
nothing behind that the next launch cannot find.

Per chunk, under the sweep lock, in this order (each step one atomic write):

1. ``submissions/<token>.json`` with state ``open``: the token, the chunk, its runs and
   attempts, and the launcher's host and pid;
2. sbatch, the job carrying the token (``--comment=mxscale:<token>``, ``MXSCALE_SUBMISSION``
   in the task's environment);
3. the intent gains the job ids (state ``accepted``);
4. one ``submitted.json`` per run, each naming the token;
5. the intent reads ``recorded``.

``resolve_open`` (next launch, or a status that gets the lock) settles what a killed
launcher left: an ``accepted`` intent is adopted (the missing submitted.json are written),
an ``open`` one may have reached sbatch unrecorded, so the jobs carrying its token are
looked up (one squeue call for all tokens) and cancelled; its runs are then submitted
afresh. A task only trains a run whose submitted.json names its token and attempt
(``sweep.executors.guard``), so nothing is ever trained twice.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runfolder.atomic import atomic_write_json, read_json
from runfolder.records import Submission
from sweep.durable import record_submissions
from sweep.errors import SweepError
from sweep.executors import slurm
from sweep.executors.slurm import SUBMITIT_FOLDER, SlurmExecutor
from sweep.store import SweepStore

JOURNAL_DIR = "submissions"
COMMENT_PREFIX = "mxscale:"
OPEN, ACCEPTED, RECORDED, ADOPTED, CANCELLED, FAILED = (
    "open",
    "accepted",
    "recorded",
    "adopted",
    "cancelled",
    "failed",
)
UNSETTLED = (OPEN, ACCEPTED)
# submitit's temporary files: pickles not yet renamed to <job>_submitted.pkl, and batch
# scripts not yet moved under their job id.
_TMP_PICKLE = re.compile(r"^[0-9a-f]{32}\.pkl$")
_TMP_SCRIPT = re.compile(r"^\.submission_file_[0-9a-f]{32}\.sh$")


def new_token() -> str:
    """A fresh submission token (16 hex digits)."""
    return secrets.token_hex(8)


def intent_path(sweep_dir: Path, token: str) -> Path:
    return Path(sweep_dir) / JOURNAL_DIR / f"{token}.json"


@dataclass
class Resolution:
    """What ``resolve_open`` did: intents adopted, jobs cancelled, stray files removed."""

    adopted: list[str]
    cancelled_jobs: list[str]
    removed_files: int


class Journal:
    """The write-ahead records of one sweep folder's submissions (call under its lock).

    Only SLURM submits jobs that outlive their launcher (``writes_journal``): the journal
    asks squeue for, and scancels, what a killed launcher may have queued.
    """

    def __init__(self, store: SweepStore, executor: str = SlurmExecutor.name) -> None:
        self.store = store
        self.executor = executor

    def open(self, runs: list[tuple[str, int]], chunk: int, chunks: int) -> str:
        """Record the intent to submit ``runs`` ((run_id, attempt), in task order)."""
        token = new_token()
        self._write(
            {
                "token": token,
                "executor": self.executor,
                "state": OPEN,
                "chunk": chunk,
                "chunks": chunks,
                "runs": [{"run_id": run_id, "attempt": attempt} for run_id, attempt in runs],
                "job_ids": None,
                "created_at": time.time(),
                "host": socket.gethostname(),
                "pid": os.getpid(),
            }
        )
        return token

    def accepted(self, token: str, submissions: list[Submission]) -> None:
        """The chunk's jobs exist: record their ids, then each run's submitted.json."""
        intent = self._read(token)
        intent.update(state=ACCEPTED, job_ids=[sub.job_id for sub in submissions])
        self._write(intent)
        # One batch: "recorded" is written only once every submitted.json is durable.
        record_submissions(self.store, submissions)
        intent["state"] = RECORDED
        self._write(intent)

    def failed(self, token: str, error: BaseException) -> None:
        """sbatch refused the chunk: nothing was queued under this token."""
        intent = self._read(token)
        intent.update(state=FAILED, error=f"{type(error).__name__}: {error}")
        self._write(intent)
        remove_stray_files(self.store.root, [])

    def cancelled(self, token: str, jobs: list[str], error: BaseException) -> None:
        """sbatch's answer was lost (a timeout): the jobs found carrying the token were
        cancelled, so nothing stays queued under it."""
        intent = self._read(token)
        intent.update(
            state=CANCELLED, cancelled_jobs=jobs, error=f"{type(error).__name__}: {error}"
        )
        self._write(intent)

    def unsettled(self) -> list[dict[str, Any]]:
        """Intents a killed launcher left open or accepted, oldest first."""
        folder = self.store.root / JOURNAL_DIR
        if not folder.is_dir():
            return []
        intents = [read_json(path) for path in folder.glob("*.json")]
        found = [i for i in intents if i is not None and i.get("state") in UNSETTLED]
        return sorted(found, key=lambda i: i.get("created_at", 0.0))

    def _read(self, token: str) -> dict[str, Any]:
        intent = read_json(intent_path(self.store.root, token))
        if intent is None:
            raise SweepError(f"{intent_path(self.store.root, token)}: intent record missing")
        return intent

    def _write(self, intent: dict[str, Any]) -> None:
        atomic_write_json(intent_path(self.store.root, intent["token"]), intent)


def resolve_open(store: SweepStore, *, strict: bool) -> Resolution:
    """Settle the intents a killed launcher left (call under the sweep lock).

    ``strict`` (a launch): raise when SLURM cannot be asked, as submitting those runs
    again could queue them twice; otherwise (status) leave them for later.
    """
    journal = Journal(store)
    intents = journal.unsettled()
    resolution = Resolution([], [], 0)
    if not intents:
        return resolution
    for intent in (i for i in intents if i["state"] == ACCEPTED):
        _adopt(store, intent)
        intent["state"] = ADOPTED
        journal._write(intent)
        resolution.adopted.append(intent["token"])
    unrecorded = [i for i in intents if i["state"] == OPEN]
    if unrecorded:
        alive = slurm.jobs_by_comment(COMMENT_PREFIX)
        if alive is None:
            if strict:
                raise SweepError(
                    f"{store.root}: {len(unrecorded)} submission(s) of a killed launch may "
                    "have reached sbatch, and squeue does not answer to tell; launch again "
                    "once SLURM answers"
                )
            return resolution
        for intent in unrecorded:
            jobs = alive.get(COMMENT_PREFIX + intent["token"], [])
            slurm.cancel_jobs(jobs)
            resolution.cancelled_jobs += jobs
            intent.update(state=CANCELLED, cancelled_jobs=jobs)
            journal._write(intent)
    resolution.removed_files = remove_stray_files(store.root, resolution.cancelled_jobs)
    return resolution


def _adopt(store: SweepStore, intent: dict[str, Any]) -> None:
    """Write the submitted.json a killed launcher did not get to (never over a newer one)."""
    for entry, job_id in zip(intent["runs"], intent["job_ids"], strict=True):
        current = read_json(store.runs_dir / entry["run_id"] / "submitted.json")
        if current is not None and current.get("token") == intent["token"]:
            continue
        if current is not None and int(current.get("attempt", 0)) >= entry["attempt"]:
            continue
        store.record_submission(
            Submission(
                entry["run_id"],
                intent["executor"],
                job_id,
                entry["attempt"],
                submitted_at=intent["created_at"],
                token=intent["token"],
            )
        )


def remove_stray_files(sweep_dir: Path, cancelled_jobs: list[str]) -> int:
    """Remove submitit's temporary files and the pickles of cancelled jobs; return how many.

    Only under the sweep lock: then no launch is between writing and renaming them.
    """
    folder = Path(sweep_dir) / SUBMITIT_FOLDER
    if not folder.is_dir():
        return 0
    arrays = {job.split("_")[0] for job in cancelled_jobs}
    removed = 0
    for path in folder.iterdir():
        name = path.name
        ours = name.endswith("_submitted.pkl") and name.split("_")[0] in arrays
        if ours or _TMP_PICKLE.match(name) or (_TMP_SCRIPT.match(name) and not path.is_symlink()):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def resolve_if_idle(store: SweepStore) -> Resolution | None:
    """``resolve_open`` for readers (status): only when no launch holds the lock, and never
    an error (a read-only folder or a silent SLURM leaves the intents for the next launch)."""
    if not (store.root / JOURNAL_DIR).is_dir():
        return None
    try:
        with store.lock(timeout_s=0):
            return resolve_open(store, strict=False)
    except (SweepError, OSError):
        return None
