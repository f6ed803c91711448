"""The `sweep` command line: launch, plan, status, run, analyze, report, export, schema, cancel,
logs, clean.

Configuration errors exit with code 2 and a message naming file, key and allowed values;
nothing is launched in that case.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperCommand

from sweep.errors import GridError, SweepError
from sweep.executors.registry import describe_choices
from sweep.store import SweepStore
from sweep.triage import HUNG_AFTER_S

if TYPE_CHECKING:
    from sweep.launch import LaunchOptions
    from sweep.progress import LaunchProgress

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Sweep, train and analyse MX low-precision scaling studies.",
)
# Piped output (CI logs, files) gets wide tables instead of Rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 200)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

# `sweep launch` that ran its runs (local, ray) and some ended failed: documented in README.
EXIT_RUNS_FAILED = 3

SweepDirArg = Annotated[Path, typer.Argument(help="sweep folder (holds runs/)")]
# The launch settings (sweep.grid.LaunchSettings) of every command that launches; each
# overrides the grid's `launch:` section.
ExecutorOpt = Annotated[str | None, typer.Option(help=describe_choices())]
WorkersOpt = Annotated[int | None, typer.Option(help="local/ray: parallel runs")]
PartitionOpt = Annotated[str | None, typer.Option(help="SLURM partition")]
AccountOpt = Annotated[str | None, typer.Option(help="SLURM account")]
QosOpt = Annotated[str | None, typer.Option(help="SLURM QOS")]
ArrayParallelismOpt = Annotated[int | None, typer.Option(help="SLURM %% limit")]
RayAddressOpt = Annotated[str | None, typer.Option(help="Ray cluster (default local)")]


SETTING_FLAGS = ("executor", "workers", "partition", "account", "qos", "array_parallelism",
                 "ray_address")  # fmt: skip


def _launch_options(
    progress: LaunchProgress, flags: dict[str, Any], **behaviour: Any
) -> LaunchOptions:
    """LaunchOptions of a launching command: its setting flags (picked by name from
    ``flags``, the command's locals) over the grid's, progress shown on ``progress``."""
    from sweep.launch import LaunchOptions, command_line_settings

    settings = command_line_settings(**{name: flags[name] for name in SETTING_FLAGS})
    return LaunchOptions(
        settings, on_event=progress.on_event, on_chunk=progress.on_chunk, **behaviour
    )


def _fail(message: str) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(2)


def _open_store(sweep_dir: Path) -> SweepStore:
    store = SweepStore(sweep_dir)
    if not store.runs_dir.is_dir():
        _fail(f"{sweep_dir}: not a sweep folder (no runs/ inside); launch a grid first")
    return store


@app.command()
def launch(
    grid: Annotated[Path, typer.Argument(help="grid YAML")],
    sweep_dir: Annotated[Path | None, typer.Option(help="default: sweeps/<grid name>")] = None,
    executor: ExecutorOpt = None,
    workers: WorkersOpt = None,
    retry_failed: Annotated[bool, typer.Option(help="resubmit failed/cancelled runs")] = False,
    update_grid: Annotated[bool, typer.Option(help="accept a changed grid")] = False,
    dry_run: Annotated[bool, typer.Option(help="show the plan, run nothing")] = False,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    array_parallelism: ArrayParallelismOpt = None,
    ray_address: RayAddressOpt = None,
    yes: Annotated[bool, typer.Option(help="go ahead beyond launch.max_runs points")] = False,
) -> None:
    """Expand GRID into runs and run those not yet finished (idempotent)."""
    from sweep.launch import launch as do_launch
    from sweep.progress import LaunchProgress

    if dry_run:
        plan(grid, yes=yes)
        return
    progress = LaunchProgress(console)
    try:
        options = _launch_options(
            progress, locals(), retry_failed=retry_failed, update_grid=update_grid, yes=yes
        )
        with progress:
            result = do_launch(grid, sweep_dir, options, on_start=progress.start)
            ran = list(result.to_submit)
            # Executors that wait for their runs: crashed runs with retry budget left run
            # again right away (each round spends budget, so this ends); the others' are
            # retried by the next launch.
            while result.waited_for_runs and _crash_retries_due(result):
                retry = dataclasses.replace(options, retry_failed=False, update_grid=False)
                result = do_launch(grid, sweep_dir, retry, on_start=progress.start)
                ran += result.to_submit
                console.print(f"retried {len(result.to_submit)} crashed run(s)")
    except (GridError, SweepError) as err:
        _fail(str(err))
    except KeyboardInterrupt:
        err_console.print("interrupted: running runs were checkpointed; launch again to resume")
        raise typer.Exit(130) from None
    skipped = ", ".join(f"{n} {s}" for s, n in sorted(result.skipped.items())) or "none"
    console.print(
        f"{len(result.expansion.runs)} runs in grid; submitted "
        f"{len(ran)} via {result.executor}; skipped: {skipped}"
    )
    console.print(f"sweep folder: {result.sweep_dir}")
    failed = _failed_runs(result, ran)
    if failed:
        console.print(
            f"[red]{failed} run(s) failed[/red]: `sweep status {result.sweep_dir} --failures` "
            "shows why"
        )
        raise typer.Exit(EXIT_RUNS_FAILED)


def _failed_runs(result, ran) -> int:
    """Runs a launch that waited for them (local, ray) ran that ended failed or vanished
    (stale); other launches (SLURM) return once submitted, their outcome is not known yet."""
    if not result.waited_for_runs or not ran:
        return 0
    store = SweepStore(result.sweep_dir)
    now = time.time()
    states = [store.record(run_id, now).state for run_id in {r.run_id for r in ran}]
    return sum(state in ("failed", "stale") for state in states)


def _crash_retries_due(result) -> bool:
    """Whether a run this round ran crashed and has crash-retry budget left."""
    from sweep.retries import crash_retry_due

    store = SweepStore(result.sweep_dir)
    max_retries = result.expansion.grid.launch.max_retries
    now = time.time()
    records = (store.record(r.run_id, now) for r in result.to_submit)
    return any(crash_retry_due(record, max_retries) for record in records)


@app.command()
def plan(
    grid: Annotated[Path, typer.Argument(help="grid YAML")],
    gpu_tflops: Annotated[
        float, typer.Option(help="sustained TFLOP/s per GPU for the GPU-hour estimate")
    ] = 150.0,
    cpu_gflops: Annotated[
        float, typer.Option(help="sustained GFLOP/s per core for the core-hour estimate")
    ] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    yes: Annotated[bool, typer.Option(help="go ahead beyond launch.max_runs points")] = False,
    calibrate_from: Annotated[
        Path | None,
        typer.Option(help="sweep folder whose measured throughput replaces the assumed rates"),
    ] = None,
    predict_from: Annotated[
        str | None,
        typer.Option(
            help="predict each run's final loss from a sweep folder's runs, or 'paper' for the "
            "paper's published runs (own L(C) or transfer from --base)"
        ),
    ] = None,
    base: Annotated[
        str, typer.Option(help="with --predict-from: base configuration for transfer")
    ] = "bf16_bf16",
) -> None:
    """Show the runs GRID expands to (N, D, C, steps) and the totals, running nothing."""
    from sweep.grid import expand_grid, load_grid, total_flops
    from sweep.plan import plan_rows, render_plan
    from sweep.preflight import check_modules

    try:
        expansion = expand_grid(load_grid(grid), grid, yes=yes)
        check_modules(str(grid), expansion.runs)
    except GridError as err:
        _fail(str(err))
    calibration = None
    if calibrate_from is not None:
        from sweep.cost import calibrated_rates

        measured = calibrated_rates(_open_store(calibrate_from).records())
        if not measured:
            _fail(f"{calibrate_from}: no run has measured throughput yet (none finished)")
        gpu_tflops = measured["gpu"][0] / 1e12 if "gpu" in measured else gpu_tflops
        cpu_gflops = measured["core"][0] / 1e9 if "core" in measured else cpu_gflops
        calibration = {
            "sweep_dir": str(calibrate_from),
            "gpu_runs": measured.get("gpu", (0, 0))[1],
            "cpu_runs": measured.get("core", (0, 0))[1],
        }
    rows = plan_rows(expansion.runs, gpu_tflops)
    flops = total_flops(expansion.runs)
    totals = {
        "runs": len(rows),
        "flops": flops,
        "dropped": expansion.dropped,
        "gpu_hours": flops / (gpu_tflops * 1e12) / 3600,
        "cpu_core_hours": flops / (cpu_gflops * 1e9) / 3600,
        "assumed_gpu_tflops": gpu_tflops,
        "assumed_cpu_gflops": cpu_gflops,
        "calibrated_from": calibration,
    }
    predictions = None
    if predict_from is not None:
        from sweep.predict import add_predictions

        try:
            predictions = add_predictions(rows, predict_from, base)
        except ValueError as err:
            _fail(f"--predict-from {predict_from}: {err}")
        totals["predicted"] = predictions
    if as_json:
        print(json.dumps({"runs": rows, "totals": totals}, indent=2))
        return
    render_plan(rows, totals, console)
    if predictions is not None:
        from sweep.predict import render_predictions

        render_predictions(rows, predictions, console)


# `sweep status` is parsed by sweep.status.main, which the console command reaches without
# loading this module (see sweep/__main__.py); here it is only listed and passed through.
@app.command(
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    }
)
def status(ctx: typer.Context) -> None:
    """SWEEP_DIR [--json] [--no-runs] [--failures] [--hung-after S]: counts by state, then one
    row per run; --failures groups failed/diverged/stale/hung runs by cause."""
    from sweep.status import main as status_main

    raise typer.Exit(status_main(ctx.args))


@app.command()
def run(run_dir: Annotated[Path, typer.Argument(help="one run folder")]) -> None:
    """Train one run folder (what every executor calls)."""
    from sweep.run import execute

    if not (run_dir / "spec.json").is_file():
        _fail(f"{run_dir}: no spec.json; not a run folder")
    raise typer.Exit(execute(run_dir))


class _RegistryHelp(TyperCommand):
    """`sweep analyze --help`: the --plot/--table names and the catalogue come from
    analysis.registry, imported only when the help is shown (it imports matplotlib)."""

    def format_help(self, ctx, formatter) -> None:
        from analysis import registry

        for param in self.params:
            if param.name in registry.KINDS:
                param.help = registry.option_help(param.name)
        sections = [
            f"{kind.capitalize()}s:\n\n"
            + "\n\n".join(f"  {line}" for line in registry.catalogue(kind))
            for kind in registry.KINDS
        ]
        self.epilog = "\n\n".join(sections)
        super().format_help(ctx, formatter)


@app.command(cls=_RegistryHelp)
def analyze(
    sweep_dir: Annotated[Path | None, typer.Argument(help="sweep folder")] = None,
    paper: Annotated[bool, typer.Option(help="use the paper's published runs")] = False,
    plot: Annotated[
        list[str] | None, typer.Option(help="a registered plot or all (repeatable)")
    ] = None,
    table: Annotated[
        list[str] | None, typer.Option(help="a registered table or all (repeatable)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="output folder")] = None,
    base: Annotated[
        str, typer.Option(help="transfer table/plot: configuration predicted from")
    ] = "bf16_bf16",
    cutoff: Annotated[
        float | None,
        typer.Option(help="transfer table/plot: fit budgets <= this (default: median budget)"),
    ] = None,
) -> None:
    """Fit scaling laws, tabulate instabilities and draw figures."""
    from analysis.report import analyze as run_analysis

    if (sweep_dir is None) == (not paper):
        _fail("give a SWEEP_DIR or --paper (one of them)")
    out_dir = out or (Path("figures/paper") if paper else sweep_dir / "figures")
    plots, tables = plot or [], table or []
    if not plots and not tables:
        plots = ["scaling"]
    try:
        written = run_analysis(
            sweep_dir,
            paper=paper,
            plots=plots,
            tables=tables,
            out_dir=out_dir,
            base=base,
            cutoff=cutoff,
        )
    except ValueError as err:
        _fail(str(err))
    for path in written:
        console.print(f"wrote {path}")


@app.command()
def report(
    sweep_dir: Annotated[Path | None, typer.Argument(help="sweep folder")] = None,
    paper: Annotated[bool, typer.Option(help="use the paper's published runs")] = False,
    out: Annotated[
        Path | None, typer.Option(help="output folder (default: SWEEP_DIR/report, figures/paper)")
    ] = None,
) -> None:
    """Write a static HTML report (index.html + every registered figure and sortable table)."""
    from analysis.site import write_report

    if (sweep_dir is None) == (not paper):
        _fail("give a SWEEP_DIR or --paper (one of them)")
    out_dir = out or (Path("figures/paper") if paper else sweep_dir / "report")
    try:
        index = write_report(sweep_dir, paper=paper, out_dir=out_dir)
    except ValueError as err:
        _fail(str(err))
    console.print(f"report: {index.resolve()}")
    console.print(f"open: {index.resolve().as_uri()}")


@app.command()
def export(
    sweep_dir: SweepDirArg,
    to: Annotated[str, typer.Option(help="tensorboard | wandb | mlflow")],
    out: Annotated[
        Path | None, typer.Option(help="output folder (default: SWEEP_DIR/export/<tracker>)")
    ] = None,
    runs: Annotated[
        list[str] | None, typer.Option(help="only these run ids (unique prefixes; repeatable)")
    ] = None,
) -> None:
    """Export every run (metrics, config, summary) as one tracker run keyed by run id."""
    from rich.markup import escape

    from sweep.export import ExportError
    from sweep.export import export as do_export

    try:
        result = do_export(sweep_dir, to, out, runs)
    except ExportError as err:
        _fail(escape(str(err)))  # "[tracking]" is not Rich markup
    console.print(
        f"{to}: wrote {len(result.written)} run(s), {len(result.unchanged)} unchanged, "
        f"{len(result.no_metrics)} without metrics yet -> {result.out_dir}"
    )


@app.command()
def intervene(
    at: Annotated[str, typer.Option(help="branch step, or 'onset' (detected in the loss)")],
    sweep_dir: Annotated[Path, typer.Option(help="the parents' sweep folder")],
    runs: Annotated[
        list[str] | None, typer.Argument(help="parent run id(s) (a unique prefix is enough)")
    ] = None,
    unstable: Annotated[
        bool, typer.Option(help="branch every run that diverged or shows an onset")
    ] = False,
    config: Annotated[
        list[str] | None, typer.Option(help="with --unstable: only these configs (repeatable)")
    ] = None,
    before: Annotated[
        list[int] | None, typer.Option(help="branch this many steps before --at (repeatable)")
    ] = None,
    arms: Annotated[str, typer.Option(help="comma-separated arms, 'all' or 'paper'")] = "all",
    executor: ExecutorOpt = None,
    workers: WorkersOpt = None,
    retry_failed: Annotated[bool, typer.Option(help="resubmit failed/cancelled arms")] = False,
    dry_run: Annotated[bool, typer.Option(help="list the branches, run nothing")] = False,
    partition: PartitionOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    array_parallelism: ArrayParallelismOpt = None,
    ray_address: RayAddressOpt = None,
) -> None:
    """Branch RUNS at a step with one precision change per arm; launch the arms as runs."""
    from sweep.intervene import intervene as do_intervene
    from sweep.intervene import parse_arms, unstable_runs
    from sweep.progress import LaunchProgress

    progress = LaunchProgress(console)
    try:
        options = _launch_options(progress, locals(), retry_failed=retry_failed, dry_run=dry_run)
        arm_names = parse_arms(arms)
        parents = list(runs or [])
        if unstable:
            parents += unstable_runs(SweepStore(sweep_dir), config)
            if not parents:
                console.print(f"{sweep_dir}: no unstable runs; nothing to branch")
                return
        with progress:
            result, plans = do_intervene(
                sweep_dir, parents, at, before or [], arm_names, options, on_start=progress.start
            )
    except (GridError, SweepError, ValueError) as err:
        _fail(str(err))
    except KeyboardInterrupt:
        err_console.print("interrupted: running arms were checkpointed; run again to resume")
        raise typer.Exit(130) from None
    for plan in plans:
        steps = ", ".join(map(str, plan.steps))
        console.print(f"{plan.parent}: {plan.reason}; branching at step(s) {steps}")
    verb = "would submit" if dry_run else "submitted"
    console.print(
        f"{len(arm_names)} arm(s): {', '.join(arm_names)}; {verb} {len(result.to_submit)} "
        f"run(s) via {result.executor}"
    )
    for record in result.to_submit if dry_run else []:
        console.print(f"  {record.run_id}  {record.spec['branch']}")
    if progress.failures:
        console.print(f"[red]{progress.failures} arm(s) failed[/red]: see `sweep status`")


@app.command()
def schema() -> None:
    """Print the JSON Schema of the grid format (for editors)."""
    from sweep.grid import grid_json_schema

    print(json.dumps(grid_json_schema(), indent=2))


@app.command()
def cancel(
    sweep_dir: SweepDirArg,
    run_ids: Annotated[list[str] | None, typer.Argument(help="runs (default: all)")] = None,
    hung: Annotated[
        bool, typer.Option(help="only runs alive without a heartbeat for --hung-after s")
    ] = False,
    hung_after: Annotated[float, typer.Option(help="seconds without a heartbeat")] = HUNG_AFTER_S,
) -> None:
    """Cancel queued or running runs (all of the sweep's, or the ones named)."""
    from sweep.cancel import cancel_runs

    store = _open_store(sweep_dir)
    try:
        cancelled = cancel_runs(store, run_ids or None, hung_after if hung else None)
    except SweepError as err:
        _fail(str(err))
    console.print(f"cancelled {len(cancelled)} run(s)")


@app.command()
def logs(
    sweep_dir: SweepDirArg,
    run_id: Annotated[str, typer.Argument(help="run id (a unique prefix is enough)")],
    attempt: Annotated[int | None, typer.Option(help="default: latest")] = None,
) -> None:
    """Print the log of one run's latest (or given) attempt."""
    store = _open_store(sweep_dir)
    matches = [rid for rid in store.run_ids() if rid.startswith(run_id)]
    if len(matches) != 1:
        _fail(f"run id {run_id!r} matches {len(matches)} runs of {sweep_dir}")
    log_dir = store.runs_dir / matches[0] / "logs"
    files = sorted(log_dir.glob("attempt-*"), key=lambda p: (len(p.name), p.name))
    if attempt is not None:
        files = [p for p in files if p.stem == f"attempt-{attempt}"]
    if not files:
        _fail(f"{log_dir}: no logs yet")
    for path in files[-2:] if attempt is None else files:
        console.rule(str(path))
        sys.stdout.write(path.read_text(errors="replace"))


@app.command()
def clean(
    sweep_dir: SweepDirArg,
    failed: Annotated[bool, typer.Option(help="reset failed/cancelled/stale runs")] = False,
) -> None:
    """Reset failed runs to pending (their files are removed; the spec stays)."""
    if not failed:
        _fail("nothing to clean: pass --failed")
    store = _open_store(sweep_dir)
    reset = 0
    with store.lock():
        for record in store.records():
            if record.state in ("failed", "cancelled", "stale"):
                for child in record.run_dir.iterdir():
                    if child.name != "spec.json":
                        shutil.rmtree(child) if child.is_dir() else child.unlink()
                reset += 1
    console.print(f"reset {reset} run(s) to pending at {time.strftime('%H:%M:%S')}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
