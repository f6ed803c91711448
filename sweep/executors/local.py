"""Local executor: a pool of long-lived worker processes on this machine.

Workers import torch and the training code once, so a run starts in well under a second
after dispatch; each run's output goes to its own log file. ``submit`` blocks until every
run has ended and reports progress through a callback. A run that asks for several
processes (resources.tasks_per_node) is started by its worker as that many ranks with
torchrun's variables (``spawn_ranks``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runfolder.codes import EXIT_OK, EXIT_PREEMPTED
from runfolder.paths import RunPaths
from runfolder.records import Submission, read_state, write_state
from sweep.errors import GridError
from sweep.executors.base import (
    BaseExecutor,
    LaunchHooks,
    check_fits_cores,
    cpus_per_run,
    die_with_parent,
    run_command,
)
from sweep.executors.processes import pid_states, signal_runs, stop_signal
from sweep.executors.registry import register

if TYPE_CHECKING:
    import multiprocessing
    from concurrent.futures import Future, ProcessPoolExecutor

    from models.config import RunSpec
    from sweep.grid import LaunchSettings


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
# How long the other ranks get to notice a failed rank (and rank 0 to record the failure)
# before they are killed.
FAILURE_GRACE_S = 30.0


@dataclass
class RunOutcome:
    """How one run ended in a worker."""

    run_id: str
    exit_code: int
    started_at: float
    ended_at: float
    worker_pid: int


OnEvent = Callable[[str, str, RunOutcome | None], None]  # (event, run_id, outcome)


def _warm_worker(threads: int) -> None:
    """Pool initializer: pay torch's import once per worker, not once per run."""
    import torch

    import models.runner  # noqa: F401

    torch.set_num_threads(threads)


def _run_in_worker(run_dir: str, attempt: int) -> RunOutcome:
    from models.config import RunSpec
    from sweep.run import execute

    started = time.time()
    paths = RunPaths(run_dir)
    paths.logs.mkdir(parents=True, exist_ok=True)
    # One log per attempt, both streams: redirected at the file-descriptor level so
    # C++/torch warnings land in the run's log too.
    saved = os.dup(1), os.dup(2)
    with open(paths.log(attempt, "log"), "ab", buffering=0) as log:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            spec = RunSpec.model_validate_json(paths.spec.read_text())
            nprocs = spec.resources.world_size
            if nprocs == 1:
                code = execute(run_dir)
            else:
                code = spawn_ranks(run_command(Path(run_dir)), nprocs)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return RunOutcome(Path(run_dir).name, code, started, time.time(), os.getpid())


def spawn_ranks(argv: list[str], nprocs: int) -> int:
    """Run ``argv`` as ``nprocs`` ranks on this machine with torchrun's variables.

    SIGTERM/SIGUSR2 to this process reach every rank (they agree on a step, checkpoint and
    exit 75). When a rank fails the others get FAILURE_GRACE_S to notice, then are killed.
    Returns the first failing rank's exit code, else rank 0's.
    """
    env = {
        **os.environ,
        "WORLD_SIZE": str(nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    ranks = [
        subprocess.Popen(
            argv,
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdin=subprocess.DEVNULL,
            # Stop requests reach the ranks through us only, never a terminal's Ctrl-C.
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        for rank in range(nprocs)
    ]
    with _forwarding(ranks):
        failed_at: float | None = None
        while any(rank.poll() is None for rank in ranks):
            if failed_at is None and any(_failed(rank.returncode) for rank in ranks):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S:
                for rank in ranks:
                    if rank.poll() is None:
                        rank.kill()
            time.sleep(0.1)
    codes = [rank.wait() for rank in ranks]
    return next((code for code in codes if _failed(code)), codes[0])


def _failed(code: int | None) -> bool:
    return code is not None and code not in (EXIT_OK, EXIT_PREEMPTED)


@contextlib.contextmanager
def _forwarding(children: list[subprocess.Popen]) -> Iterator[None]:
    """Forward SIGTERM/SIGUSR2 to the children while inside, and SIGINT (Ctrl-C) as SIGTERM:
    they checkpoint and stop (main thread only)."""

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, forward) for sig in (*_STOP_SIGNALS, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@register("local")
class LocalExecutor(BaseExecutor):
    """Runs each run folder in a pool of ``workers`` processes (default: cores / cpus)."""

    auto_priority = 1  # always here: what ``auto`` falls back to

    def __init__(
        self,
        workers: int | None = None,
        cpus_per_run: int = 1,
        on_event: OnEvent | None = None,
        sweep_dir: Path | None = None,
    ):
        cores = os.cpu_count() or 1
        self.workers = workers or max(1, cores // cpus_per_run)
        self.cpus_per_run = cpus_per_run
        self.on_event = on_event or (lambda event, run_id, outcome: None)
        self.sweep_dir = sweep_dir

    @classmethod
    def for_launch(
        cls, sweep_dir: Path, settings: LaunchSettings, specs: list[RunSpec], hooks: LaunchHooks
    ) -> LocalExecutor:
        return cls(settings.workers, cpus_per_run(specs), hooks.on_event, sweep_dir)

    @classmethod
    def for_sweep(cls, sweep_dir: Path) -> LocalExecutor:
        return cls(sweep_dir=sweep_dir)

    @classmethod
    def check_specs(cls, source: str, specs: list[RunSpec]) -> None:
        """No GPU runs without a CUDA device, no more cores than here, one node."""
        for spec in specs:
            if spec.resources.gpus and not _has_cuda_device():
                raise GridError(
                    f"{source}: run {spec.run_id} asks for resources.gpus="
                    f"{spec.resources.gpus} but this machine has no GPU; use "
                    "--executor slurm or set resources.gpus: 0"
                )
            check_fits_cores(source, [spec])
            if spec.resources.nodes > 1:
                raise GridError(
                    f"{source}: run {spec.run_id} asks for resources.nodes="
                    f"{spec.resources.nodes}; only the slurm executor spans nodes"
                )

    def submit(self, run_dirs: list[Path], attempts: dict[str, int]) -> list[Submission]:
        """Run everything; return the submissions once all runs have ended."""
        submissions = [
            Submission(d.name, self.name, f"local-{os.getpid()}", attempts[d.name])
            for d in run_dirs
        ]
        remaining = list(run_dirs)
        while remaining:
            remaining = self._run_pool(remaining, attempts)
        return submissions

    def _run_pool(self, run_dirs: list[Path], attempts: dict[str, int]) -> list[Path]:
        """Run a batch; if a worker dies, return the runs that never started, to rerun.

        SIGINT/SIGTERM to the launcher stop dispatching and SIGTERM the workers, whose runs
        checkpoint and end as preempted; the next launch resumes them.
        """
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        from concurrent.futures.process import BrokenProcessPool

        context = multiprocessing.get_context("spawn")
        unstarted: list[Path] = []
        stop = _StopRequest()
        with (
            stop,
            ProcessPoolExecutor(
                self.workers,
                mp_context=context,
                initializer=_warm_worker,
                initargs=(self.cpus_per_run,),
            ) as pool,
        ):
            futures: dict[Future, Path] = {}
            for run_dir in run_dirs:
                futures[pool.submit(_run_in_worker, str(run_dir), attempts[run_dir.name])] = run_dir
            pending = set(futures)
            # The worker processes seen so far: when one dies, its exit code says how.
            workers: dict[int, multiprocessing.Process] = {}
            while pending:
                workers.update(getattr(pool, "_processes", None) or {})
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                if stop.requested and not stop.forwarded:
                    stop.forward(pool, pending)
                for future in done:
                    run_dir = futures[future]
                    if future.cancelled():
                        continue
                    try:
                        outcome = future.result()
                    except BrokenProcessPool:
                        if _started(run_dir):
                            record_killed(run_dir, _worker_exit(run_dir, workers))
                            self.on_event("crashed", run_dir.name, None)
                        else:
                            unstarted.append(run_dir)
                        continue
                    record_killed(run_dir, outcome.exit_code)  # a rank of a multi-process run
                    events = {EXIT_OK: "done", EXIT_PREEMPTED: "preempted"}
                    event = events.get(outcome.exit_code, "failed")
                    self.on_event(event, run_dir.name, outcome)
        if stop.requested:
            raise KeyboardInterrupt("launch interrupted; runs were checkpointed")
        return unstarted

    def query(self, submissions: list[Submission]) -> dict[str, str]:
        """Through the pids in the run folders: the run's process, else its launcher's."""
        return pid_states(self._sweep_dir(), submissions)

    def cancel(self, submissions: list[Submission], *, kill: bool = False) -> None:
        """Signal the runs' processes: SIGTERM checkpoints and stops them, ``kill`` SIGKILLs."""
        signal_runs(self._sweep_dir(), submissions, stop_signal(kill))

    def _sweep_dir(self) -> Path:
        if self.sweep_dir is None:
            raise ValueError("query/cancel need the sweep folder: LocalExecutor(sweep_dir=...)")
        return self.sweep_dir


class _StopRequest:
    """Records SIGINT/SIGTERM to the launcher while the pool runs (main thread only)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False
        self.forwarded = False
        self._previous: dict = {}

    def __enter__(self) -> _StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def forward(self, pool: ProcessPoolExecutor, pending: set[Future]) -> None:
        """Drop queued runs and ask running ones to checkpoint and stop."""
        self.forwarded = True
        for future in pending:
            future.cancel()
        # The executor keeps its worker processes private; there is no public accessor.
        for process in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)


def _worker_exit(run_dir: Path, workers: dict[int, multiprocessing.Process]) -> int | None:
    """Exit code of the worker that ran ``run_dir`` (its marker names the pid), if known."""
    marker = read_state(run_dir) or {}
    worker = workers.get(int(marker.get("pid") or 0))
    return None if worker is None else worker.exitcode


def record_killed(run_dir: Path, exit_code: int | None) -> None:
    """Mark a run whose process a signal killed mid-training (the OOM killer's SIGKILL) as
    failed with that cause; its own marker still says running. SIGTERM is not recorded:
    the pool sends it to the other workers when one dies, and those runs resume."""
    if exit_code is None or exit_code >= 0 or -exit_code == signal.SIGTERM:
        return
    marker = read_state(run_dir)
    if marker is None or marker.get("state") != "running":
        return
    signum = -exit_code
    known = signum in signal.valid_signals()
    hint = "out of memory?" if signum == signal.SIGKILL else known and signal.Signals(signum).name
    marker.update(state="failed", signal=signum, reason=f"killed by signal {signum} ({hint})")
    write_state(run_dir, marker)


def _started(run_dir: Path) -> bool:
    return RunPaths(run_dir).state.exists()


def _has_cuda_device() -> bool:
    return Path("/dev/nvidiactl").exists()
