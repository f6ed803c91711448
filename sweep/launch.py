"""Launch a grid: expand, freeze into the sweep folder, submit only what still needs to run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.config import RunSpec
from runfolder.records import Submission
from sweep.durable import record_submissions, write_specs
from sweep.errors import GridError
from sweep.executors.base import Executor, LaunchHooks
from sweep.executors.registry import AUTO, executor_class, resolve_executor_name
from sweep.grid import Expansion, LaunchSettings, expand_grid, frozen_grid_text, load_grid
from sweep.journal import Journal, resolve_open
from sweep.preflight import preflight
from sweep.reconcile import current_records
from sweep.retries import crash_retry_due, note_crash_retry
from sweep.store import RunRecord, SweepStore

# States that a plain launch (re)submits; failed/cancelled need --retry-failed.
RESUBMIT = ("pending", "stale", "preempted", "incomplete")
RETRYABLE = ("failed", "cancelled")


@dataclass
class LaunchOptions:
    """What one command that launches (launch, intervene) was asked for: launch settings
    given on its command line (the fields set override the grid's ``launch`` section),
    how to treat finished runs, and the callbacks that show progress."""

    settings: LaunchSettings | None = None
    retry_failed: bool = False
    update_grid: bool = False
    dry_run: bool = False
    on_event: Any = None
    on_chunk: Any = None  # SLURM: called per array chunk submitted
    yes: bool = False  # go ahead with a grid of more than launch.max_runs points

    def effective(self, grid_launch: LaunchSettings) -> LaunchSettings:
        """The grid's launch settings with those set on the command line over them."""
        given = self.settings
        if given is None:
            return grid_launch
        return grid_launch.model_copy(
            update={key: getattr(given, key) for key in given.model_fields_set}
        )

    @property
    def hooks(self) -> LaunchHooks:
        return LaunchHooks(self.on_event, self.on_chunk)


@dataclass
class LaunchResult:
    """What a launch found and did."""

    expansion: Expansion | None
    skipped: dict[str, int] = field(default_factory=dict)
    to_submit: list[RunRecord] = field(default_factory=list)
    submissions: list[Submission] = field(default_factory=list)
    executor: str = ""
    sweep_dir: Path = Path(".")

    @property
    def waited_for_runs(self) -> bool:
        """Whether the runs submitted have ended (their outcomes are in their folders)."""
        return executor_class(self.executor).waits_for_runs


def command_line_settings(**flags: Any) -> LaunchSettings:
    """The launch settings a command's flags give (None: not given, the grid's applies);
    GridError (exit 2) naming the flag, its value and what is allowed."""
    from pydantic import ValidationError

    given = {key: value for key, value in flags.items() if value is not None}
    if given.get("executor", AUTO) != AUTO:
        executor_class(given["executor"])  # unknown: the registry names the allowed ones
    try:
        return LaunchSettings(**given)
    except ValidationError as err:
        first = err.errors()[0]
        key = str(first["loc"][0])
        flag = "--" + key.replace("_", "-")
        raise GridError(f"{flag} {given.get(key)!r}: {first['msg']}") from None


def default_sweep_dir(grid_path: str | Path, grid_name: str) -> Path:
    """sweeps/<grid name> under the current directory."""
    return Path("sweeps") / (grid_name or Path(grid_path).stem)


def make_executor(
    name: str, store: SweepStore, settings: LaunchSettings, runs: list[RunSpec], hooks: LaunchHooks
) -> Executor:
    """Build the named executor from the launch settings; its resources are the largest any
    run of the launch asks for."""
    return executor_class(name).for_launch(store.root, settings, runs, hooks)


def check_specs(
    source: str, specs: list[RunSpec], executor_name: str, settings: LaunchSettings
) -> None:
    """Every check that applies before anything is written: the executor's placement of
    the runs, then the runs' data and the cluster (sweep.preflight); GridError on the first."""
    cls = executor_class(executor_name)
    cls.check_specs(source, specs)
    preflight(source, specs, cls, settings)


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
    settings = options.effective(grid.launch)
    executor_name = resolve_executor_name(settings.executor)
    check_specs(str(grid_path), expansion.runs, executor_name, settings)
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

    return submit_specs(store, expansion.runs, settings, options, register, on_start, result)


def submit_specs(
    store: SweepStore,
    specs: list[RunSpec],
    settings: LaunchSettings,
    options: LaunchOptions,
    register: Callable[[], None],
    on_start: Callable[[list[RunRecord], str], None] | None,
    result: LaunchResult,
    only: set[str] | None = None,
) -> LaunchResult:
    """Under the sweep lock: ``register`` the runs, write their specs, and submit those in a
    resubmittable state (restricted to ``only`` when given) via ``result.executor``, built
    from ``settings`` (the effective launch settings)."""
    executor_name = result.executor
    executor = make_executor(executor_name, store, settings, specs, options.hooks)
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
            elif crash_retry_due(record, settings.max_retries):
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
        if executor_class(executor_name).writes_journal:
            # The journal writes each chunk's submitted.json as soon as sbatch accepts it.
            journal = Journal(store, executor_name)
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
