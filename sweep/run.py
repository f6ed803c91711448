"""The one entry point every executor runs: ``python -m sweep.run <run_dir>``.

Reads spec.json, trains (resuming from the run's latest checkpoint), and writes the run's
own state markers: state.json with a heartbeat while running, summary.json then a terminal
state.json at the end (files and records: runfolder). Exit codes (runfolder.codes): 0
done/diverged, 75 preempted (requeue me), 1 failed.

A run of several processes is started as one ``sweep.run`` per rank (by srun, torchrun or
the local executor); they join one process group, rank 0 decides whether to start and
writes every marker, the other ranks train silently and exit with the same codes.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from models.config import RunSpec
from runfolder.codes import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from runfolder.paths import RunPaths, checkpoint_steps
from runfolder.records import (
    TERMINAL_STATES,
    StateMarker,
    cancel_applies,
    read_cancel,
    read_state,
    read_submitted,
    write_state,
    write_summary,
)
from sweep.executors.base import ATTEMPT_ENV, TOKEN_ENV

if TYPE_CHECKING:
    from models.distributed import World

HEARTBEAT_EVERY_S = 5.0


class StateWriter:
    """Writes state.json for one attempt; throttles heartbeats so they cost nothing."""

    def __init__(self, run_dir: Path, total_steps: int, attempt: int, processes: int = 1):
        self.run_dir = run_dir
        self.total_steps = total_steps
        self.attempt = attempt
        self.processes = processes
        self.started = time.time()
        self._last_write = 0.0
        self._last_loss: float | None = None
        self._first_step_at: float | None = None
        self._first_step: int | None = None

    def write(self, state: str, step: int, **extra) -> None:
        marker: StateMarker = {
            "state": state,
            "step": step,
            "total_steps": self.total_steps,
            "attempt": self.attempt,
            "heartbeat": time.time(),
            "started_at": self.started,
            "last_loss": self._last_loss,
            "first_step_at": self._first_step_at,
            "first_step": self._first_step,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "processes": self.processes,
            **extra,
        }
        write_state(self.run_dir, marker)

    def progress(self, step: int, total_steps: int, loss: float | None) -> None:
        """Reporter hook called by the training loop at each logged step."""
        if loss is not None:
            self._last_loss = loss
        first = self._first_step_at is None
        if first:
            self._first_step_at = time.time()
            self._first_step = step
        if first or time.monotonic() - self._last_write >= HEARTBEAT_EVERY_S:
            self._last_write = time.monotonic()
            self.write("running", step)


def execute(run_dir: str | Path) -> int:
    """Train the run in ``run_dir`` to completion (or preemption); return the exit code."""
    from models.distributed import joined  # torch is imported here, not at CLI start

    run_dir = Path(run_dir)
    marker = read_state(run_dir) or {}
    if marker.get("state") in TERMINAL_STATES:
        return EXIT_OK
    foreign = _not_current_submission(run_dir)
    if foreign:
        print(foreign, flush=True)
        return EXIT_OK
    spec = RunSpec.model_validate_json(RunPaths(run_dir).spec.read_text())
    with joined(spec.resources.world_size) as world:
        if world.is_main:
            code = _lead(spec, run_dir, marker, world)
        # Rank 0 alone reads the cancel request: the ranks must agree on starting.
        elif not world.from_main(None):
            code = EXIT_OK
        else:
            code = _follow(spec, run_dir)
        if code != EXIT_FAILED:
            # No rank tears the group down while another is still in a collective (a
            # failed rank skips this: the others learn of it from their collectives).
            world.barrier()
        return code


def _lead(spec: RunSpec, run_dir: Path, marker: dict, world: World) -> int:
    """Rank 0 (or the only process): train and write the run's markers."""
    from models.runner import train_run
    from models.train import Preempted

    submitted = read_submitted(run_dir) or {}
    attempt = max(int(submitted.get("attempt", 1)), int(marker.get("attempt", 0)))
    writer = StateWriter(run_dir, spec.train.steps, attempt, world.size)
    cancelled = _cancel_requested(run_dir, attempt)
    world.from_main(not cancelled)
    if cancelled:
        writer.write("cancelled", int(marker.get("step", 0)), reason="cancelled before start")
        return EXIT_OK
    # The checkpoint, not the marker's last step: the steps after it are trained again.
    start_step = max(checkpoint_steps(RunPaths(run_dir).checkpoints), default=0)
    print(
        f"attempt {attempt}: "
        + (f"resuming from step {start_step}" if start_step else "starting")
        + f" of {spec.train.steps} on {world.size} process(es)",
        flush=True,
    )
    if world.size != spec.resources.world_size:
        # Allowed: ranks split the same global batch, so the trajectory is the same.
        print(
            f"note: resources ask for {spec.resources.world_size} process(es), "
            f"launched with {world.size}",
            flush=True,
        )
    writer.write("running", start_step)
    _record_provenance(run_dir, attempt)
    try:
        summary = train_run(spec, run_dir, reporter=writer)
    except Preempted as stop:
        step = stop.step
        if _cancel_requested(run_dir, attempt):
            writer.write("cancelled", step, reason="cancelled by `sweep cancel`")
            return EXIT_OK
        writer.write("preempted", step, reason=str(stop))
        return EXIT_PREEMPTED
    except Exception as err:  # noqa: BLE001 - any crash is recorded as a failed run
        tail = traceback.format_exc().strip().splitlines()[-6:]
        writer.write(
            "failed",
            int(marker.get("step", 0)),
            reason=f"{type(err).__name__}: {err}",
            traceback="\n".join(tail),
        )
        traceback.print_exc()
        return EXIT_FAILED
    write_summary(run_dir, summary)
    writer.write(summary["state"], int(summary["steps_done"]))
    return EXIT_OK


def _follow(spec: RunSpec, run_dir: Path) -> int:
    """A rank other than 0: train in step with rank 0, write nothing."""
    from models.runner import train_run
    from models.train import Preempted

    try:
        train_run(spec, run_dir)
    except Preempted:
        return EXIT_PREEMPTED
    except Exception:  # noqa: BLE001 - rank 0 records the failure it sees in the collectives
        traceback.print_exc()
        return EXIT_FAILED
    return EXIT_OK


def _record_provenance(run_dir: Path, attempt: int) -> None:
    """Which code, packages and machine this attempt runs on (sweep.provenance); a run
    never fails for want of it."""
    from sweep.provenance import write_provenance

    try:
        write_provenance(run_dir, attempt)
    except OSError as err:
        print(f"note: provenance not recorded: {err}", flush=True)


def _not_current_submission(run_dir: Path) -> str | None:
    """Why a job that passed its token (and attempt) may not train this run, or None.

    A stale or orphan job (a later submission replaced it, or a killed launcher never
    recorded it) exits at once instead of training a run another job owns.
    """
    token = os.environ.get(TOKEN_ENV)
    if not token:
        return None  # started by an executor without tokens (local, ray) or by hand
    attempt = os.environ.get(ATTEMPT_ENV)
    current = read_submitted(run_dir) or {}
    if current.get("token") == token and (
        attempt is None or str(current.get("attempt")) == attempt
    ):
        return None
    return (
        f"submission {token} (attempt {attempt}) is not the current submission of "
        f"{run_dir.name} ({current.get('token') or 'none'}, attempt "
        f"{current.get('attempt', '-')}): exiting without training"
    )


def _cancel_requested(run_dir: Path, attempt: int) -> bool:
    return cancel_applies(read_cancel(run_dir), attempt)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m sweep.run <run_dir>", file=sys.stderr)
        return 2
    return execute(args[0])


if __name__ == "__main__":
    code = main()
    distributed = sys.modules.get("models.distributed")  # loaded only if a run trained
    if distributed is None:
        sys.exit(code)
    distributed.exit_process(code)
