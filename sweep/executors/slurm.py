"""SLURM executor: submitit job arrays chunked under the cluster's limits, requeue on preemption.

Each array task runs the run's command as a child process, forwards SIGTERM/SIGUSR2 to it
and, when the child exits with EXIT_PREEMPTED (75: it checkpointed and wants to continue),
requeues itself so the run resumes from its checkpoint in the same job id.

A run of several processes gets nodes x tasks-per-node array tasks (srun starts one per
rank, each with its SLURM_PROCID); every task runs the command, and rank 0's task alone
requeues the job. Runs with different layouts go to different arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runfolder.codes import EXIT_PREEMPTED
from runfolder.records import Submission
from sweep import faults
from sweep.errors import GridError
from sweep.executors.base import (
    ATTEMPT_ENV,
    TOKEN_ENV,
    BaseExecutor,
    LaunchHooks,
    cpus_per_run,
    run_command,
)
from sweep.executors.processes import launch_logged
from sweep.executors.registry import register

if TYPE_CHECKING:
    from models.config import RunSpec
    from sweep.grid import LaunchSettings
    from sweep.journal import Journal

_QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
_RUNNING = {
    "RUNNING",
    "COMPLETING",
    "CONFIGURING",
    "SUSPENDED",
    "STOPPED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
}
# "12_[0-3,7%2]": the pending remainder of an array, folded into one scheduler record.
_FOLDED_ARRAY = re.compile(r"^(?P<job>\d+)_\[(?P<ranges>[\d,\-]+)(?:%\d+)?\]$")
_FORWARDED = (signal.SIGTERM, signal.SIGUSR2)
_SCHEDULER_TIMEOUT_S = 60
# submitit's folder (pickles, batch scripts, its own logs) inside the sweep folder.
SUBMITIT_FOLDER = "slurm"


@dataclass(frozen=True)
class ChunkSubmitted:
    """One array chunk accepted by sbatch, and how far the submission has come."""

    index: int  # 1-based, in submission order
    chunks: int
    array_id: str  # the array's job id (a lone run's plain job id)
    size: int  # runs in this chunk
    runs_submitted: int  # runs in this and the earlier chunks
    runs_total: int


OnChunk = Callable[[ChunkSubmitted], None]


@dataclass(frozen=True)
class TaskLayout:
    """Where one run's processes go: nodes, ranks per node, GPUs per node, CPUs per rank."""

    nodes: int = 1
    tasks_per_node: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 1

    def parameters(self) -> dict[str, Any]:
        """The submitit.SlurmExecutor parameters of this layout."""
        params = {
            "nodes": self.nodes,
            "ntasks_per_node": self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
        }
        # Per node, not per task: every rank then sees all the node's GPUs and picks its
        # own by local rank, as torchrun would.
        if self.gpus_per_node:
            params["gpus_per_node"] = self.gpus_per_node
        return params


class SlurmUnavailableError(RuntimeError):
    """sbatch is missing or the SLURM controller does not answer."""


def slurm_available() -> bool:
    """True when sbatch is on PATH and `scontrol ping` reports the controller UP."""
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        return False
    ping = _scheduler(["scontrol", "ping"])
    return ping.returncode == 0 and "UP" in ping.stdout


def chunk_runs(items: Sequence[Any], max_array_size: int) -> list[list[Any]]:
    """Split items into arrays whose size stays below max_array_size (task ids 0..size-1)."""
    if max_array_size < 2:
        raise ValueError(f"max_array_size must be >= 2, got {max_array_size}")
    size = max_array_size - 1
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def scheduler_state(slurm_state: str) -> str:
    """Map a SLURM job state ("CANCELLED by 0", "RUNNING", ...) to queued|running|gone."""
    word = slurm_state.split()[0].rstrip("+") if slurm_state.strip() else ""
    if word in _QUEUED:
        return "queued"
    if word in _RUNNING:
        return "running"
    return "gone"


def run_answer(slurm_state: str) -> str:
    """What a job's SLURM state says of its run: ``scheduler_state``, except that a job gone
    as CANCELLED (a person's scancel) reads ``cancelled``. The scheduler's own preemption
    reads PREEMPTED and a time limit TIMEOUT: those runs resume on a plain launch, a
    cancelled one only with ``--retry-failed``."""
    state = scheduler_state(slurm_state)
    if state == "gone" and slurm_state.split()[:1] == ["CANCELLED"]:
        return "cancelled"
    return state


def parse_job_states(lines: Iterable[str]) -> dict[str, str]:
    """Parse "jobid|STATE" lines (sacct -P / squeue) into {"<array>_<task>": SLURM state}.

    Folded pending records such as "12_[0-3%2]" are expanded to one entry per task. A task's
    own record wins over a folded one: sacct keeps showing the folded range after a task
    has been split off it (e.g. cancelled while pending).
    """
    explicit: dict[str, str] = {}
    folded_states: dict[str, str] = {}
    for line in lines:
        if "|" not in line:
            continue
        job_id, state = (part.strip() for part in line.split("|", 1))
        folded = _FOLDED_ARRAY.match(job_id)
        if folded is None:
            explicit[job_id] = state
            continue
        for task in _expand_ranges(folded.group("ranges")):
            folded_states[f"{folded.group('job')}_{task}"] = state
    return {**folded_states, **explicit}


def _expand_ranges(ranges: str) -> list[int]:
    tasks: list[int] = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        tasks.extend(range(int(low), int(high or low) + 1))
    return tasks


def _scheduler(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=_SCHEDULER_TIMEOUT_S, check=False
        )
    except (FileNotFoundError, subprocess.TimeoutExpired) as err:
        return subprocess.CompletedProcess(argv, 127, "", str(err))


def task_outcome(returncode: int, received: set[int]) -> str:
    """ "done", "requeue" or "failed" for a child's exit code and the signals the task got.

    EXIT_PREEMPTED means the run checkpointed and wants to continue. A run killed by the very
    signal SLURM sent (it reaches the child directly as well as through us, so a second copy
    can land while the run is exiting) was interrupted, not broken: it resumes too.
    """
    if returncode == 0:
        return "done"
    if returncode == EXIT_PREEMPTED or -returncode in received:
        return "requeue"
    return "failed"


def run_array_task(argv: list[str], run_dir: str, attempt: int) -> int:
    """Body of one array task: run the command, forward preemption signals, requeue on 75."""
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    # The run checks this attempt (and the job's token, already in the environment) against
    # its submitted.json before training.
    child = launch_logged(argv, Path(run_dir), attempt, rank, env={ATTEMPT_ENV: str(attempt)})
    received: set[int] = set()

    def forward(signum: int, _frame: object) -> None:
        received.add(signum)
        if child.poll() is None:
            child.send_signal(signum)

    # Replaces submitit's own handlers: the child decides how to checkpoint.
    for signum in _FORWARDED:
        signal.signal(signum, forward)
    returncode = child.wait()
    outcome = task_outcome(returncode, received)
    if outcome == "requeue":
        # One requeue per job: the task of rank 0, which writes the run's markers.
        if rank == 0:
            _requeue_self()
    elif outcome == "failed":
        raise RuntimeError(f"{argv[0]} for {run_dir} exited with {returncode}; see its logs/")
    return returncode


def _requeue_self() -> None:
    # submitit submits a chunk of one run as a plain job, not as an array.
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job:
        job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    else:
        job = os.environ["SLURM_JOB_ID"]
    # Only a job still RUNNING was warned (USR2 before its limit) or signalled by hand. A
    # cancelled, timed-out or preempted job reads COMPLETING, and SLURM 22.05 would requeue
    # even a cancelled one, undoing `sweep cancel`.
    state = _scheduler(["squeue", "-h", "-j", job, "-o", "%T"]).stdout.strip()
    if state != "RUNNING":
        print(f"not requeueing {job}: it is {state or 'unknown'}", file=sys.stderr)
        return
    result = _scheduler(["scontrol", "requeue", job])
    if result.returncode != 0:
        print(f"requeue of {job} refused: {result.stderr.strip()}", file=sys.stderr)


@register("slurm")
class SlurmExecutor(BaseExecutor):
    """Submit run folders as submitit job arrays, one sbatch per chunk below MaxArraySize.

    ``settings`` (a grid's ``launch`` section merged with the command line) gives the
    partition, account, QOS and array parallelism; the other arguments the resources.
    """

    waits_for_runs = False
    writes_journal = True
    tracks_pids = False
    auto_priority = 0
    auto_when = " if sbatch exists"

    def __init__(
        self,
        sweep_dir: Path,
        settings: LaunchSettings | None = None,
        *,
        time_min: int = 60,
        cpus_per_task: int = 1,
        gpus_per_task: int = 0,
        mem_gb: float | None = None,
        extra: dict[str, Any] | None = None,
        command: Callable[[Path], list[str]] = run_command,
        max_array_size: int | None = None,
        on_chunk: OnChunk | None = None,
        layouts: dict[str, TaskLayout] | None = None,
    ) -> None:
        if shutil.which("sbatch") is None:
            raise SlurmUnavailableError(
                "sbatch not found on PATH: the slurm executor needs a SLURM client "
                "(try slurm/local-cluster.sh up, or --executor local)"
            )
        array_parallelism = settings.array_parallelism if settings else None
        _check_at_least("time_min", time_min, 1)
        _check_at_least("cpus_per_task", cpus_per_task, 1)
        _check_at_least("gpus_per_task", gpus_per_task, 0)
        if array_parallelism is not None:
            _check_at_least("array_parallelism", array_parallelism, 1)
        if max_array_size is not None:
            _check_at_least("max_array_size", max_array_size, 2)
        if mem_gb is not None and mem_gb <= 0:
            raise ValueError(f"mem_gb must be > 0, got {mem_gb}")
        self.sweep_dir = Path(sweep_dir).absolute()
        self.folder = Path(sweep_dir) / SUBMITIT_FOLDER
        self.command = command
        self.array_parallelism = array_parallelism
        self.max_array_size = max_array_size
        self.on_chunk = on_chunk
        self.layouts = layouts or {}
        self.parameters = _sbatch_parameters(
            job_name=f"sweep-{Path(sweep_dir).name}",
            partition=settings.partition if settings else None,
            account=settings.account if settings else None,
            qos=settings.qos if settings else None,
            time_min=time_min,
            cpus_per_task=cpus_per_task,
            gpus_per_task=gpus_per_task,
            mem_gb=mem_gb,
            extra=extra,
        )

    @classmethod
    def detected(cls) -> bool:
        return shutil.which("sbatch") is not None

    @classmethod
    def for_launch(
        cls, sweep_dir: Path, settings: LaunchSettings, specs: list[RunSpec], hooks: LaunchHooks
    ) -> SlurmExecutor:
        """Executor-wide resources are the largest any run asks for; each run's own layout
        (nodes x tasks, GPUs and CPUs per task) goes with it."""
        if not slurm_available():
            raise GridError(
                "--executor slurm: no working SLURM here (sbatch not on PATH or "
                "`scontrol ping` fails); use --executor local or ray"
            )
        return cls(
            sweep_dir,
            settings,
            cpus_per_task=cpus_per_run(specs),
            time_min=max(spec.resources.time_min for spec in specs),
            gpus_per_task=max(spec.resources.gpus for spec in specs),
            mem_gb=max((spec.resources.mem_gb or 0 for spec in specs), default=0) or None,
            on_chunk=hooks.on_chunk,
            layouts={
                spec.run_id: TaskLayout(
                    spec.resources.nodes,
                    spec.resources.tasks_per_node,
                    spec.resources.gpus,
                    spec.resources.cpus,
                )
                for spec in specs
            },
        )

    @classmethod
    def for_sweep(cls, sweep_dir: Path) -> SlurmExecutor:
        return cls(sweep_dir)

    @classmethod
    def check_cluster(cls, source: str, specs: list[RunSpec], settings: LaunchSettings) -> None:
        """The partition, account and QOS exist for this user, and every run fits a node."""
        from sweep.preflight import check_cluster

        check_cluster(source, specs, settings.partition, settings.account, settings.qos)

    @classmethod
    def run_states(cls, sweep_dir: Path, submissions: list[Submission]) -> dict[str, str]:
        """``query`` with a person's scancel read as ``cancelled``; {} without squeue."""
        if not submissions or shutil.which("squeue") is None:
            return {}
        return cls(sweep_dir).query(submissions, run_answer)

    @classmethod
    def final_outcomes(cls, submissions: list[Submission]) -> dict[str, tuple[str, str]]:
        """{run_id: (final SLURM state, exit code)} from one ``sacct`` call; {} without it."""
        by_job = {str(sub.job_id): sub.run_id for sub in submissions if sub.job_id}
        if not by_job or not shutil.which("sacct"):
            return {}
        arrays = sorted({job.split("_")[0] for job in by_job})
        argv = ["sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode", "-j", ",".join(arrays)]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return {}
        outcomes = parse_sacct(out).items()
        return {by_job[job]: outcome for job, outcome in outcomes if job in by_job}

    def submit(
        self, run_dirs: list[Path], attempts: dict[str, int], journal: Journal | None = None
    ) -> list[Submission]:
        """Submit one array per chunk of runs with the same layout; job ids are
        "<array>_<task>" (a lone run: "<job>").

        With a ``journal``, each chunk's intent is recorded before its sbatch and its job
        ids and submitted.json files right after (see sweep.journal), and each task checks
        it is its run's current submission before training. ``on_chunk`` hears of each
        chunk once recorded. Runs without an entry in ``layouts`` take the executor-wide
        cpus/gpus per task.
        """
        if not run_dirs:
            return []
        from sweep.executors.slurm_limits import read_submit_limits, submit_chunk, waves

        limits = read_submit_limits(self.parameters.get("account"), self.parameters.get("qos"))
        if self.max_array_size:
            limits = dataclasses.replace(limits, max_array_size=self.max_array_size)
        by_layout: dict[TaskLayout | None, list[Path]] = {}
        for run_dir in run_dirs:
            by_layout.setdefault(self.layouts.get(run_dir.name), []).append(run_dir)
        submissions: list[Submission] = []
        # Chunks fit MaxArraySize and the room MaxSubmitJobs/MaxJobCount leave; a full
        # queue is waited out (sweep.executors.slurm_limits).
        chunks = waves(list(by_layout.items()), limits)
        for index, (layout, chunk, estimated) in enumerate(chunks, start=1):
            chunk_attempts = [attempts.get(run_dir.name, 1) for run_dir in chunk]
            runs = [
                (run_dir.name, attempt)
                for run_dir, attempt in zip(chunk, chunk_attempts, strict=True)
            ]
            sbatch = functools.partial(self._sbatch, layout, chunk, chunk_attempts)
            token, jobs = submit_chunk(journal, runs, index, estimated, sbatch, self.sweep_dir)
            faults.passed("after-sbatch")
            chunk_subs = [
                Submission(run_dir.name, self.name, job.job_id, attempt, token=token)
                for run_dir, job, attempt in zip(chunk, jobs, chunk_attempts, strict=True)
            ]
            if journal:
                journal.accepted(token, chunk_subs)
            submissions += chunk_subs
            if self.on_chunk is not None:
                self.on_chunk(
                    ChunkSubmitted(
                        index,
                        estimated,
                        jobs[0].job_id.split("_")[0],
                        len(chunk),
                        len(submissions),
                        len(run_dirs),
                    )
                )
            faults.passed("after-chunk")
        return submissions

    def _sbatch(
        self, layout: TaskLayout | None, chunk: list[Path], attempts: list[int], token: str
    ) -> list[Any]:
        """One sbatch of ``chunk`` as an array whose jobs carry ``token``; its submitit jobs."""
        import submitit  # imported here: it is only needed where sbatch exists

        from sweep.journal import intent_path

        faults.passed("before-sbatch")
        executor = submitit.SlurmExecutor(folder=self.folder)
        executor.update_parameters(
            **self._tagged(self._parameters(layout), token, intent_path(self.sweep_dir, token)),
            array_parallelism=self.array_parallelism or len(chunk),
        )
        return executor.map_array(
            run_array_task,
            [self.command(run_dir) for run_dir in chunk],
            [str(run_dir) for run_dir in chunk],
            attempts,
        )

    @staticmethod
    def _tagged(params: dict[str, Any], token: str, intent: Path) -> dict[str, Any]:
        """``params`` with the chunk's token in the job's comment and environment, and the
        guard first in its batch script (exit 3: not the current submission, end the task)."""
        from sweep.journal import COMMENT_PREFIX

        guard = f"{shlex.quote(sys.executable)} -m sweep.executors.guard {shlex.quote(str(intent))}"
        return {
            **params,
            "additional_parameters": {
                **params.get("additional_parameters", {}),
                "comment": COMMENT_PREFIX + token,
            },
            "setup": [f"export {TOKEN_ENV}={token}", f"{guard}; [ $? -ne 3 ] || exit 0"],
        }

    def _parameters(self, layout: TaskLayout | None) -> dict[str, Any]:
        if layout is None:
            return self.parameters
        shared = {k: v for k, v in self.parameters.items() if k != "gpus_per_task"}
        return {**shared, **layout.parameters()}

    def query(
        self, submissions: list[Submission], answer: Callable[[str], str] = scheduler_state
    ) -> dict[str, str]:
        """sacct first, squeue for what accounting does not (yet) know; unreachable: unknown.

        ``answer`` maps a SLURM state to the value reported (``run_answer``: with cancelled).
        """
        by_job = {sub.job_id: sub.run_id for sub in submissions if sub.job_id}
        if not by_job:
            return {}
        arrays = sorted({job_id.split("_")[0] for job_id in by_job})
        known = _sacct_states(arrays)
        if not set(by_job) <= set(known):
            # Accounting off, or it lags a fresh submission: the controller knows better.
            squeue = _squeue_states(arrays)
            if squeue is None:
                return {
                    run: answer(known[job]) if job in known else "unknown"
                    for job, run in by_job.items()
                }
            known = {**known, **squeue}
        return {run: answer(known.get(job, "")) for job, run in by_job.items()}

    def cancel(self, submissions: list[Submission], *, kill: bool = False) -> None:
        """scancel the submissions' array tasks (finished ones are ignored by SLURM); the
        job's tasks get SIGTERM, then SIGKILL after the cluster's KillWait (``kill`` too)."""
        cancel_jobs([sub.job_id for sub in submissions if sub.job_id])


def parse_sacct(text: str) -> dict[str, tuple[str, str]]:
    """``JobID|State|ExitCode`` lines into {job id: (state, exit code)}; the last line for a
    job wins (a requeued task appears once per attempt), "CANCELLED by 0" becomes CANCELLED."""
    out: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) < 3 or not parts[0]:
            continue
        out[parts[0]] = (parts[1].split(" ")[0], parts[2])
    return out


def jobs_by_comment(prefix: str) -> dict[str, list[str]] | None:
    """{comment: [job ids]} of the live jobs whose comment starts with ``prefix`` (one squeue
    call; arrays by their array id); None when the controller does not answer."""
    result = _scheduler(["squeue", "-h", "-o", "%F|%k"])
    if result.returncode != 0:
        return None
    found: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        job_id, _, comment = line.strip().partition("|")
        if comment.startswith(prefix) and job_id not in found.get(comment, []):
            found.setdefault(comment, []).append(job_id)
    return found


def cancel_jobs(job_ids: list[str]) -> None:
    """scancel these jobs (whole arrays for array ids)."""
    if job_ids:
        _scheduler(["scancel", *job_ids])


def _check_at_least(label: str, value: int, low: int) -> None:
    if value < low:
        raise ValueError(f"{label} must be >= {low}, got {value}")


def signal_delay_s(time_min: int) -> int:
    """Seconds before its time limit that a task is warned (USR2) to checkpoint: submitit's
    90 s, but at most a quarter of the limit, else a job of a minute or so is warned as it
    starts and requeues itself without ever training."""
    return min(90, time_min * 15)


def _sbatch_parameters(
    *,
    job_name: str,
    partition: str | None,
    account: str | None,
    qos: str | None,
    time_min: int,
    cpus_per_task: int,
    gpus_per_task: int,
    mem_gb: float | None,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """submitit.SlurmExecutor parameters; only the set ones, so cluster defaults apply."""
    params: dict[str, Any] = {
        "job_name": job_name,
        "time": time_min,
        "signal_delay_s": signal_delay_s(time_min),
        "cpus_per_task": cpus_per_task,
        # Without --requeue a cluster with JobRequeue=0 refuses `scontrol requeue`.
        "additional_parameters": {"requeue": True, **(extra or {})},
    }
    optional = {"partition": partition, "account": account, "qos": qos}
    params.update({key: value for key, value in optional.items() if value is not None})
    if gpus_per_task:
        params["gpus_per_task"] = gpus_per_task
    if mem_gb is not None:
        params["mem"] = f"{max(1, round(mem_gb * 1024))}M"
    return params


def _sacct_states(arrays: list[str]) -> dict[str, str]:
    result = _scheduler(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(arrays)])
    return parse_job_states(result.stdout.splitlines()) if result.returncode == 0 else {}


def _squeue_states(arrays: list[str]) -> dict[str, str] | None:
    """States the controller still holds; None when the controller cannot be asked."""
    argv = ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(arrays)]
    result = _scheduler(argv)
    if result.returncode == 0:
        return parse_job_states(result.stdout.splitlines())
    # squeue fails outright when every id asked for has been purged: they are all gone.
    if "Invalid job id" in result.stderr:
        return {}
    return None
