"""Run commands as child processes with per-attempt log files, and ask or signal the runs
of a sweep through their pids: shared by the executors whose runs are processes they start
(SLURM array tasks, Ray trials) or whose runs live on this host (local, Ray)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path

from runfolder.atomic import read_json
from runfolder.paths import RunPaths
from runfolder.records import Submission
from sweep.executors.base import die_with_parent
from sweep.store import _process_alive


def launch_logged(
    argv: list[str], run_dir: Path, attempt: int, rank: int = 0, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start argv with stdout/stderr appended to <run_dir>/logs/attempt-<attempt>.out|err
    (rank r > 0 of a multi-process run: attempt-<attempt>.rank<r>.out|err)."""
    paths = RunPaths(run_dir)
    paths.logs.mkdir(parents=True, exist_ok=True)
    with (
        open(paths.log(attempt, "out", rank), "ab") as out,
        open(paths.log(attempt, "err", rank), "ab") as err,
    ):
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
            env=None if env is None else {**os.environ, **env},
        )


def _here(record: dict) -> bool:
    return record.get("host") == socket.gethostname() and bool(record.get("pid"))


def _started_marker(run_dir: Path, attempt: int) -> dict | None:
    """The run's state.json once this attempt has started, else None."""
    marker = read_json(RunPaths(run_dir).state)
    return marker if marker is not None and marker.get("attempt", 0) >= attempt else None


def pid_states(sweep_dir: Path, submissions: list[Submission]) -> dict[str, str]:
    """Scheduler states of runs held by processes of this host: ``running`` while the
    attempt's own process lives, ``queued`` while not started and its launcher lives,
    ``gone`` otherwise; runs of another host (their pids cannot be checked) are left out."""
    states: dict[str, str] = {}
    for sub in submissions:
        run_dir = Path(sweep_dir) / "runs" / sub.run_id
        marker = _started_marker(run_dir, sub.attempt)
        if marker is not None:
            if _here(marker):
                alive = marker.get("state") == "running" and _process_alive(marker)
                states[sub.run_id] = "running" if alive else "gone"
            continue
        launcher = read_json(RunPaths(run_dir).submitted) or {}
        if _here(launcher):
            states[sub.run_id] = "queued" if _process_alive(launcher) else "gone"
    return states


def signal_runs(sweep_dir: Path, submissions: list[Submission], signum: int) -> None:
    """Send ``signum`` to the process of each run that has started on this host
    (SIGTERM: it checkpoints and stops; SIGKILL: it ends at once)."""
    for sub in submissions:
        marker = _started_marker(Path(sweep_dir) / "runs" / sub.run_id, sub.attempt)
        if marker is not None and _here(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(marker["pid"]), signum)


def stop_signal(kill: bool) -> int:
    """SIGKILL for ``kill`` (a hung run never reaches a checkpoint), else SIGTERM."""
    return signal.SIGKILL if kill else signal.SIGTERM
