"""`sweep status`: where every run stands, as aligned tables or JSON.

Status must answer within a second for a 1,000-run sweep, whole process included, so this
module has its own argparse entry point (``main``) that ``sweep status`` reaches without
loading the typer command line (typer converts every parameter through pydantic: ~0.4 s of
imports), and it lays out its tables itself: rich.table needs ~2 s for 1,000 rows, one
styled Text ~0.05 s. Rich is imported only when a table is printed, never for ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Container, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runfolder.atomic import read_json
from sweep.cost import Estimate, estimate, fmt_duration, worth_showing
from sweep.journal import resolve_if_idle
from sweep.provenance import PROVENANCE_FILE
from sweep.reconcile import current_records
from sweep.store import RUN_STATES, WAITING_STATES, RunRecord, SweepStore
from sweep.triage import HUNG_AFTER_S, mark_hung, render_failures, triage

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

STATE_STYLE = {
    "done": "green",
    "diverged": "magenta",
    "failed": "red",
    "stale": "red",
    "running": "cyan",
    "queued": "yellow",
    "preempted": "yellow",
    "cancelled": "dim",
    "pending": "dim",
    "hung": "red",
    "incomplete": "dim",
}
# The store's states plus `hung`, which status derives (sweep.triage.mark_hung).
STATES = (*RUN_STATES, "hung")
RUN_COLUMNS = (
    "run_id",
    "config",
    "budget",
    "d_model",
    "seed",
    "state",
    "step",
    "loss",
    "attempt",
    "job",
    "reason",
)
# A cell is its text, or its text and a Rich style.
Cell = str | tuple[str, str]


def run_row(record: RunRecord) -> dict[str, Any]:
    """One run as a flat, JSON-able row."""
    marker = record.marker or {}
    summary = record.summary or {}
    spec = record.spec
    loss = summary.get("final_val_loss", marker.get("last_loss"))
    return {
        "run_id": record.run_id,
        "config": record.config,
        "state": record.state,
        "budget": spec.get("budget"),
        # The proxy's width plays the LM's d_model.
        "d_model": spec.get("model", {}).get("d_model") or spec.get("model", {}).get("width"),
        "seed": spec.get("seed"),
        "step": _shown_step(record, summary),
        "total_steps": record.total_steps,
        "loss": loss,
        "attempt": record.attempt,
        "job_id": record.submission.job_id if record.submission else None,
        "reason": marker.get("reason"),
    }


def _shown_step(record: RunRecord, summary: dict[str, Any]) -> int:
    """Steps done; for a run waiting to continue, the checkpoint it resumes from (steps
    after it are trained again), not the last step its marker saw."""
    if "steps_done" in summary:
        return int(summary["steps_done"])
    if record.state in WAITING_STATES and record.marker:
        return record.resume_step
    return record.step


def state_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Runs per state, in lifecycle order, states with no run left out."""
    counts = Counter(row["state"] for row in rows)
    return {state: counts[state] for state in STATES if counts[state]}


def counts_table(rows: list[dict[str, Any]]) -> Text:
    """Runs per state for each config x budget, with a total line."""
    totals = state_counts(rows)
    states = list(totals)
    grouped: dict[tuple[str, Any], Counter] = {}
    for row in rows:
        grouped.setdefault((row["config"], row["budget"]), Counter())[row["state"]] += 1
    lines: list[list[Cell]] = [
        [config, _fmt_budget(budget), *(_count_cell(counter[s], s) for s in states)]
        for (config, budget), counter in sorted(
            grouped.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)
        )
    ]
    lines.append([("total", "bold"), "", *((str(totals[s]), "bold") for s in states)])
    header = ["config", "budget (FLOPs)", *states]
    return aligned_table(f"{len(rows)} runs by state", header, lines, right=range(1, len(header)))


def runs_table(rows: list[dict[str, Any]]) -> Text:
    """One line per run: state, progress, last loss, attempt, job and failure reason."""
    lines: list[list[Cell]] = [
        [
            row["run_id"],
            row["config"],
            _fmt_budget(row["budget"]),
            str(row["d_model"]),
            str(row["seed"]),
            (row["state"], STATE_STYLE.get(row["state"], "")),
            f"{row['step']}/{row['total_steps']}",
            "" if row["loss"] is None else f"{row['loss']:.4f}",
            str(row["attempt"]),
            row["job_id"] or "",
            (row["reason"] or "")[:60],
        ]
        for row in rows
    ]
    return aligned_table("runs", RUN_COLUMNS, lines)


def aligned_table(
    title: str, header: Sequence[str], rows: Sequence[Sequence[Cell]], *, right: Container[int] = ()
) -> Text:
    """A title, a bold header, a rule and one line per row, columns padded to their widest
    cell (those in ``right`` right-aligned); built as one Text so it prints in one go."""
    from rich.text import Span, Text

    cells = [[(c, "") if isinstance(c, str) else c for c in row] for row in rows]
    widths = [max([len(name)] + [len(row[i][0]) for row in cells]) for i, name in enumerate(header)]
    columns_at = [sum(widths[:i]) + 2 * i for i in range(len(widths))]
    lines = [title]
    spans = [Span(0, len(title), "italic")]
    offset = len(title) + 1
    for line in [
        [(name, "bold") for name in header],
        [("-" * width, "dim") for width in widths],
        *cells,
    ]:
        parts = []
        for i, (value, style) in enumerate(line):
            pad = " " * (widths[i] - len(value))
            start = offset + columns_at[i] + (len(pad) if i in right else 0)
            if style:
                spans.append(Span(start, start + len(value), style))
            parts.append(pad + value if i in right else value + pad)
        text = "  ".join(parts).rstrip()
        lines.append(text)
        offset += len(text) + 1
    return Text("\n".join(lines), spans=spans)


def render(rows: list[dict[str, Any]], console: Console, *, show_runs: bool = True) -> None:
    """Counts by state per config x budget, then (with ``show_runs``) one line per run."""
    console.print(counts_table(rows), soft_wrap=True)
    if show_runs:
        console.print()
        console.print(runs_table(rows), soft_wrap=True)


def main(argv: Sequence[str] | None = None) -> int:
    """`sweep status SWEEP_DIR [--json] [--no-runs]`; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="sweep status",
        description="Where every run of SWEEP_DIR stands: counts by state, then one row per run.",
    )
    parser.add_argument("sweep_dir", type=Path, help="sweep folder (holds runs/)")
    parser.add_argument(
        "--json", dest="as_json", action="store_true", help="machine-readable output"
    )
    parser.add_argument(
        "--runs", action=argparse.BooleanOptionalAction, default=True, help="also list every run"
    )
    parser.add_argument(
        "--failures",
        action="store_true",
        help="failed/diverged/stale/hung runs grouped by cause, with a log tail per group",
    )
    parser.add_argument(
        "--hung-after",
        type=float,
        default=HUNG_AFTER_S,
        metavar="SECONDS",
        help=f"a live run without a heartbeat for this long is hung (default {HUNG_AFTER_S:g})",
    )
    args = parser.parse_args(argv)
    store = SweepStore(args.sweep_dir)
    if not store.runs_dir.is_dir():
        print(
            f"error: {args.sweep_dir}: not a sweep folder (no runs/ inside); launch a grid first",
            file=sys.stderr,
        )
        return 2
    resolve_if_idle(store)  # what a killed launch left half-submitted
    records = current_records(store)
    mark_hung(records, args.hung_after, time.time())
    if args.failures:
        return _print(failures_report(records, args.as_json))
    rows = [run_row(record) for record in records]
    commits = Counter()
    for record, row in zip(records, rows, strict=True):
        row["commit"] = (read_json(record.run_dir / PROVENANCE_FILE) or {}).get("commit")
        if row["commit"]:
            commits[row["commit"]] += 1
    now = time.time()
    per_config, total = estimate(records, now)
    if not args.as_json:
        from rich.console import Console

        console = Console()
        console.print(counts_table(rows), soft_wrap=True)
        if len(commits) > 1:
            mixed = ", ".join(f"{c[:10]} ({n} runs)" for c, n in commits.most_common())
            console.print(f"note: runs from {len(commits)} commits: {mixed}", highlight=False)
        if worth_showing(records):
            console.print()
            console.print(cost_table(per_config, total), soft_wrap=True)
        if args.runs:
            console.print()
            console.print(runs_table(rows), soft_wrap=True)
        return 0
    report = {
        "counts": state_counts(rows),
        "commits": dict(commits.most_common()),
        "cost": {
            "configs": {name: e.to_json() for name, e in per_config.items()},
            "total": total.to_json(),
        },
        "runs": rows,
    }
    return _print(json.dumps(report, indent=2))


def cost_table(per_config: dict[str, Estimate], total: Estimate) -> Text:
    """Per config and in total: runs finished, device-hours spent and left, ETA."""
    header = ["config", "finished", "GPU-h", "core-h", "GPU-h left", "core-h left", "ETA", "from"]

    def line(name: Cell, e: Estimate) -> list[Cell]:
        return [
            name,
            f"{e.finished}/{e.runs}",
            f"{e.elapsed_hours['gpu']:.3g}",
            f"{e.elapsed_hours['core']:.3g}",
            f"{e.remaining_hours['gpu']:.3g}",
            f"{e.remaining_hours['core']:.3g}",
            fmt_duration(e.eta_s()),
            ", ".join(f"{n} {source}" for source, n in sorted(e.sources.items())),
        ]

    lines = [line(name, e) for name, e in per_config.items()]
    lines.append(line(("total", "bold"), total))
    return aligned_table("cost and ETA", header, lines, right=range(1, 7))


def failures_report(records: list[RunRecord], as_json: bool) -> str:
    """`--failures`: the triage groups as text, or as JSON."""
    groups = triage(records)
    if as_json:
        return json.dumps({"groups": [group.to_json() for group in groups]}, indent=2)
    return render_failures(groups)


def _print(text: str) -> int:
    try:
        print(text)
    except BrokenPipeError:
        # The reader stopped early (`sweep status DIR --json | head`): exit as Rich does for
        # the tables, without a traceback or a second error when stdout is flushed at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


def _count_cell(count: int, state: str) -> Cell:
    return (str(count), STATE_STYLE.get(state, "")) if count else ""


def _fmt_budget(budget: float | None) -> str:
    return "" if budget is None else f"{budget:.3g}"
