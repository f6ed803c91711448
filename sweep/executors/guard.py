"""First thing a SLURM task runs: train only if this job is its run's current submission.

``python -m sweep.executors.guard <intent.json>`` runs in the batch script before submitit
unpickles anything (so an orphan task never waits 60 s for a pickle). It exits 0 when the
run's submitted.json names this job's token and attempt, and SKIP (3) otherwise, after one
log line, once the launcher that wrote the intent can no longer be about to record it.
Standard library only: it costs a bare interpreter start.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from runfolder.atomic import read_json
from runfolder.paths import RunPaths

SKIP = 3
# How long a task waits for a live launcher to write its run's submitted.json (sbatch
# returned, the launcher is recording the chunk: milliseconds per run).
WAIT_FOR_LAUNCHER_S = 30.0


def _launcher_may_record(intent: dict) -> bool:
    """True while the launcher of an unrecorded intent may still write its records."""
    if intent.get("state") not in ("open", "accepted"):
        return False
    if intent.get("host") != socket.gethostname():
        return True  # another machine's process cannot be checked: wait out the bound
    try:
        os.kill(int(intent["pid"]), 0)
    except (ProcessLookupError, KeyError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def check(intent_file: Path, task_index: int, wait_s: float = WAIT_FOR_LAUNCHER_S) -> str | None:
    """None when this task may train; else why not (one line)."""
    intent = read_json(intent_file)
    if intent is None:
        return None  # no journal (a direct executor submission): nothing to check against
    token = intent["token"]
    entry = intent["runs"][task_index]
    run_dir = intent_file.parent.parent / "runs" / entry["run_id"]
    deadline = time.monotonic() + wait_s
    while True:
        current = read_json(RunPaths(run_dir).submitted) or {}
        if current.get("token") == token and current.get("attempt") == entry["attempt"]:
            return None
        intent = read_json(intent_file) or intent
        if not _launcher_may_record(intent) or time.monotonic() > deadline:
            return (
                f"orphan task of submission {token} (attempt {entry['attempt']}): run "
                f"{entry['run_id']}'s current submission is "
                f"{current.get('token') or 'none'} (attempt {current.get('attempt', '-')}, "
                f"job {current.get('job_id') or '-'}); exiting without training"
            )
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m sweep.executors.guard <intent.json>", file=sys.stderr)
        return 2
    intent_file = Path(args[0])
    task_index = int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))
    reason = check(intent_file, task_index)
    if reason is None:
        return 0
    print(reason, file=sys.stderr, flush=True)
    # Also in the run's own logs, where `sweep logs` looks.
    run_id = (read_json(intent_file) or {})["runs"][task_index]["run_id"]
    logs = intent_file.parent.parent / "runs" / run_id / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "skipped-tasks.log", "a") as handle:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        handle.write(f"{stamp} job {os.environ.get('SLURM_JOB_ID', '?')}: {reason}\n")
    return SKIP


if __name__ == "__main__":
    sys.exit(main())
