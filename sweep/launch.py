"""Launch a grid: expand, freeze into the sweep folder, submit only what still needs to run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.config import RunSpec
from runfolder.records import Submission
from sweep import faults
from sweep.durable import record_submissions, write_specs
from sweep.errors import GridError
from sweep.executors.base import Executor
from sweep.grid import Expansion, LaunchSettings, expand_grid, frozen_grid_text, load_grid
from sweep.journal import Journal, resolve_open
from sweep.preflight import preflight
from sweep.reconcile import current_records
from sweep.retries import crash_retry_due, note_crash_retry
from sweep.store import RunRecord, SweepStore

# States that a plain launch (re)submits; failed/cancelled need --retry-failed.
RESUBMIT = ("pending", "stale", "preempted", "incomplete")
RETRYABLE = ("failed", "cancelled")
EXECUTORS = ("auto", "local", "slurm", "ray")


@dataclass
class LaunchOptions:
    """Command-line choices for one launch (None: take the grid's launch section)."""

    executor: str | None = None
    workers: int | None = None
    retry_failed: bool = False
    update_grid: bool = False
    dry_run: bool = False
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    array_parallelism: int | None = None
    ray_address: str | None = None
    on_event: Any = None
    on_chunk: Any = None  # SLURM: called per array chunk submitted
    yes: bool = False  # go ahead with a grid of more than launch.max_runs points


@dataclass
class LaunchResult:
    """What a launch found and did."""

    expansion: Expansion | None
    skipped: dict[str, int] = field(default_factory=dict)
    to_submit: list[RunRecord] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)
    executor: str = "local"
    sweep_dir: Path = Path(".")


def default_sweep_dir(grid_path: str | Path, grid_name: str) -> Path:
    """sweeps/<grid name> under the current directory."""
    return Path("sweeps") / (grid_name or Path(grid_path).stem)


def resolve_executor_name(requested: str) -> str:
    """``auto`` picks slurm when sbatch is on PATH, else local."""
    if requested not in EXECUTORS:
        raise GridError(f"unknown executor {requested!r}; allowed: {', '.join(EXECUTORS)}")
    if requested == "auto":
        return "slurm" if shutil.which("sbatch") else "local"
    return requested


def make_executor(
    name: str, store: SweepStore, options: LaunchOptions, runs: list[RunSpec], grid_launch
) -> Executor:
    """Build the named executor with options from flags first, then the grid; resources are
    the largest any run of the grid asks for."""
    # A local run of several processes takes cores for each of them.
    cpus_per_run = max(spec.resources.cpus * spec.resources.tasks_per_node for spec in runs)
    if name == "local":
        from sweep.executors.local import LocalExecutor

        return LocalExecutor(
            options.workers or grid_launch.workers, cpus_per_run, on_event=options.on_event
        )
    if name == "slurm":
        from sweep.executors.slurm import SlurmExecutor, TaskLayout, slurm_available

        if not slurm_available():
            raise GridError(
                "--executor slurm: no working SLURM here (sbatch not on PATH or "
                "`scontrol ping` fails); use --executor local or ray"
            )
        return SlurmExecutor(
            store.root,
            partition=options.partition or grid_launch.partition,
            account=options.account or grid_launch.account,
            qos=options.qos or grid_launch.qos,
            cpus_per_task=cpus_per_run,
            time_min=max(spec.resources.time_min for spec in runs),
            gpus_per_task=max(spec.resources.gpus for spec in runs),
            mem_gb=max((spec.resources.mem_gb or 0 for spec in runs), default=0) or None,
            array_parallelism=options.array_parallelism or grid_launch.array_parallelism,
            on_chunk=options.on_chunk,
            layouts={
                spec.run_id: TaskLayout(
                    spec.resources.nodes,
                    spec.resources.tasks_per_node,
                    spec.resources.gpus,
                    spec.resources.cpus,
                )
                for spec in runs
            },
        )
    from sweep.executors.ray_exec import RayExecutor

    return RayExecutor(
        address=options.ray_address,
        num_cpus=options.workers,
        cpus_per_run=cpus_per_run,
        on_event=options.on_event,
    )


def launch(
    grid_path: str | Path,
    sweep_dir: str | Path | None,
    options: LaunchOptions,
    on_start: Callable[[list[RunRecord], str], None] | None = None,
) -> LaunchResult:
    """Expand the grid and submit the runs that are missing, stale or (optionally) failed.

    Branched runs (``sweep intervene``) of the sweep are resubmitted by the same rules.
    ``on_start(records, executor)`` is called once the runs to submit are known.
    """
    grid = load_grid(grid_path)
    expansion = expand_grid(grid, grid_path, yes=options.yes)
    if not expansion.runs:
        raise GridError(
            f"{grid_path}: the grid expands to no runs after filters (dropped: {expansion.dropped})"
        )
    executor_name = resolve_executor_name(options.executor or grid.launch.executor)
    check_resources(str(grid_path), expansion.runs, executor_name)
    preflight(
        str(grid_path),
        expansion.runs,
        executor_name,
        options.partition or grid.launch.partition,
        options.account or grid.launch.account,
        options.qos or grid.launch.qos,
    )
    store = SweepStore(sweep_dir or default_sweep_dir(grid_path, grid.name))
    result = LaunchResult(expansion, executor=executor_name, sweep_dir=store.root)
    if options.dry_run:
        return result

    def register() -> None:
        store.initialise(
            frozen_grid_text(grid, grid_path),
            [s.run_id for s in expansion.runs],
            update_grid=options.update_grid,
        )

    return submit_specs(store, expansion.runs, grid.launch, options, register, on_start, result)


def submit_specs(
    store: SweepStore,
    specs: list[RunSpec],
    grid_launch: LaunchSettings,
    options: LaunchOptions,
    register: Callable[[], None],
    on_start: Callable[[list[RunRecord], str], None] | None,
    result: LaunchResult,
    only: set[str] | None = None,
) -> LaunchResult:
    """Under the sweep lock: ``register`` the runs, write their specs, and submit those in a
    resubmittable state (restricted to ``only`` when given) via ``result.executor``."""
    executor_name = result.executor
    executor = make_executor(executor_name, store, options, specs, grid_launch)
    with store.lock():
        register()
        write_specs(store, [(spec.run_id, spec.model_dump_json(indent=2)) for spec in specs])
        # What a killed launch left half-submitted is adopted or cancelled before anything
        # is submitted again, so no run is queued twice.
        resolve_open(store, strict=True)
        records = [r for r in current_records(store) if only is None or r.run_id in only]
        wanted = RESUBMIT + (RETRYABLE if options.retry_failed else ())
        for record in records:
            if record.state in wanted:
                result.to_submit.append(record)
            elif crash_retry_due(record, grid_launch.max_retries):
                note_crash_retry(record)
                result.to_submit.append(record)
            else:
                result.skipped[record.state] = result.skipped.get(record.state, 0) + 1
        # Longest runs first: a pool of workers then finishes sooner (no long tail).
        known = {spec.run_id: spec for spec in specs}
        result.to_submit.sort(key=lambda r: _estimated_cost(r, known), reverse=True)
        attempts = {r.run_id: r.attempt + 1 for r in result.to_submit}
        run_dirs = [r.run_dir for r in result.to_submit]
        if on_start:
            on_start(result.to_submit, executor_name)
        if executor_name == "slurm":
            # The journal writes each chunk's submitted.json as soon as sbatch accepts it.
            journal = Journal(store)
            result.submissions = executor.submit(run_dirs, attempts, journal) if run_dirs else []
            return result
        # Blocking executors: mark the runs as ours while holding the lock, then run them.
        record_submissions(
            store,
            [Submission(d.name, executor_name, None, attempts[d.name]) for d in run_dirs],
        )
    if run_dirs:
        result.submissions = executor.submit(run_dirs, attempts)
    return result


def _estimated_cost(record: RunRecord, known: dict[str, RunSpec]) -> float:
    """Relative cost of a run: tokens x (parameters + a per-step overhead). The specs of this
    launch are at hand; only a run from an earlier one (a branch) is read from its folder."""
    spec = known.get(record.run_id) or RunSpec.model_validate(record.spec)
    return spec.tokens * (spec.n_params + 50_000)


def check_resources(source: str, specs: list[RunSpec], executor_name: str) -> None:
    """Refuse runs this executor cannot place, before anything is written or submitted."""
    if executor_name == "slurm":
        return
    cores = os.cpu_count() or 1
    for spec in specs:
        if spec.resources.gpus and executor_name == "local" and not _has_cuda_device():
            raise GridError(
                f"{source}: run {spec.run_id} asks for resources.gpus="
                f"{spec.resources.gpus} but this machine has no GPU; use "
                "--executor slurm or set resources.gpus: 0"
            )
        if spec.resources.cpus * spec.resources.tasks_per_node > cores:
            raise GridError(
                f"{source}: run {spec.run_id} asks for resources.cpus="
                f"{spec.resources.cpus} x tasks_per_node={spec.resources.tasks_per_node} "
                f"but this machine has {cores} cores"
            )
        if spec.resources.world_size > 1 and executor_name == "ray":
            raise GridError(
                f"{source}: run {spec.run_id} asks for {spec.resources.world_size} processes "
                "(resources.nodes x tasks_per_node); only the local and slurm executors "
                "start multi-process runs"
            )
        if spec.resources.nodes > 1 and executor_name == "local":
            raise GridError(
                f"{source}: run {spec.run_id} asks for resources.nodes="
                f"{spec.resources.nodes}; only the slurm executor spans nodes"
            )


def _has_cuda_device() -> bool:
    return Path("/dev/nvidiactl").exists()
