"""`sweep status`: where every run stands, as Rich tables or JSON."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.console import Console
from rich.table import Table

from sweep.store import RUN_STATES, RunRecord

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
}


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
        "d_model": spec.get("model", {}).get("d_model"),
        "seed": spec.get("seed"),
        "step": int(summary.get("steps_done", record.step)),
        "total_steps": record.total_steps,
        "loss": loss,
        "attempt": record.attempt,
        "job_id": record.submission.job_id if record.submission else None,
        "reason": marker.get("reason"),
    }


def state_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts = Counter(row["state"] for row in rows)
    return {state: counts[state] for state in RUN_STATES if counts[state]}


def render(rows: list[dict[str, Any]], console: Console, *, show_runs: bool = True) -> None:
    """Counts by state per config x budget, then one line per run."""
    states = [s for s in RUN_STATES if any(r["state"] == s for r in rows)]
    grouped: dict[tuple[str, Any], Counter] = {}
    for row in rows:
        grouped.setdefault((row["config"], row["budget"]), Counter())[row["state"]] += 1
    counts = Table(title=f"{len(rows)} runs by state", title_justify="left")
    counts.add_column("config")
    counts.add_column("budget (FLOPs)", justify="right")
    for state in states:
        counts.add_column(state, justify="right", style=STATE_STYLE.get(state))
    for (config, budget), counter in sorted(
        grouped.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)
    ):
        counts.add_row(config, _fmt_budget(budget), *(str(counter[s] or "") for s in states))
    totals = Counter(row["state"] for row in rows)
    counts.add_row("[b]total[/b]", "", *(f"[b]{totals[s]}[/b]" for s in states))
    console.print(counts)
    if not show_runs:
        return
    runs = Table(title="runs", title_justify="left")
    for column in (
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
    ):
        runs.add_column(column, overflow="fold")
    for row in rows:
        style = STATE_STYLE.get(row["state"], "")
        loss = "" if row["loss"] is None else f"{row['loss']:.4f}"
        runs.add_row(
            row["run_id"],
            row["config"],
            _fmt_budget(row["budget"]),
            str(row["d_model"]),
            str(row["seed"]),
            f"[{style}]{row['state']}[/{style}]" if style else row["state"],
            f"{row['step']}/{row['total_steps']}",
            loss,
            str(row["attempt"]),
            row["job_id"] or "",
            (row["reason"] or "")[:60],
        )
    console.print(runs)


def _fmt_budget(budget: float | None) -> str:
    return "" if budget is None else f"{budget:.3g}"
