"""`sweep plan --predict-from`: predicted final loss of each planned run beside its cost."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from analysis.configs import parse_config
from analysis.load import load_paper_runs, load_sweep_runs
from analysis.transfer import predict_planned

PAPER = "paper"


def load_source(source: str) -> pd.DataFrame:
    """Runs to predict from: the paper's table for 'paper', else a sweep folder's runs."""
    if source == PAPER:
        return load_paper_runs()
    path = Path(source)
    if not path.is_dir():
        raise ValueError(f"not a sweep folder (or '{PAPER}' for the paper's runs)")
    return load_sweep_runs(path)


def _config_name(name: str) -> str:
    """The analysis spelling of a configuration (the paper's 'bfloat16' is 'bf16')."""
    try:
        return parse_config(name).name
    except ValueError:
        return name


def _number(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def add_predictions(rows: list[dict[str, Any]], source: str, base: str) -> dict[str, Any]:
    """Add predicted_loss, predicted_lo, predicted_hi, predicted_by and prediction_flags to
    every plan row (None where the configuration cannot be predicted) and return a summary:
    how many runs are predictable and what they and all runs cost.

    The prediction is the best loss the source's laws expect at the run's budget (or C = 6ND
    without one): the compute-optimal envelope, so a run of an off-optimal shape will do worse.
    """
    runs = load_source(source)
    # The grid's budget, where set, matches the source's budgets (C = 6ND is a little off it).
    compute = [r["C"] if r["budget"] is None else r["budget"] for r in rows]
    planned = pd.DataFrame({"config": [_config_name(r["config"]) for r in rows], "C": compute})
    pred = predict_planned(runs, planned, base)
    for row, p in zip(rows, pred.itertuples(index=False), strict=True):
        row["predicted_loss"] = _number(float(p.predicted))
        row["predicted_lo"] = _number(float(p.predicted_lo))
        row["predicted_hi"] = _number(float(p.predicted_hi))
        row["predicted_by"] = p.method
        row["prediction_flags"] = p.flags
    ok = [r for r in rows if r["predicted_loss"] is not None]
    hours = [r["gpu_hours"] for r in ok if r["gpu_hours"] is not None]
    return {
        "source": source,
        "base": base,
        "runs": len(ok),
        "unpredictable": len(rows) - len(ok),
        "flops": sum(r["C"] for r in ok),
        "gpu_hours": sum(hours) if hours else None,
    }


def _loss(row: dict[str, Any]) -> str:
    if row["predicted_loss"] is None:
        return ""
    if row["predicted_lo"] is None:
        return f"{row['predicted_loss']:.4f}"
    return f"{row['predicted_loss']:.4f} [{row['predicted_lo']:.4f}, {row['predicted_hi']:.4f}]"


def render_predictions(
    rows: list[dict[str, Any]], summary: dict[str, Any], console: Console
) -> None:
    """A table of predicted final loss (95% interval) beside each run's cost, and the totals."""
    table = Table(
        title=f"predicted final val loss from {summary['source']} (95% interval)",
        title_justify="left",
    )
    for column in ("run_id", "config", "C", "GPU-h", "predicted loss", "by", "flags"):
        table.add_column(column, justify="right" if column in ("C", "GPU-h") else "left")
    for row in rows:
        table.add_row(
            row["run_id"],
            row["config"],
            f"{row['C']:.3g}",
            "" if row["gpu_hours"] is None else f"{row['gpu_hours']:.3g}",
            _loss(row),
            row["predicted_by"],
            row["prediction_flags"],
        )
    console.print(table)
    hours = summary["gpu_hours"]
    console.print(
        f"predicted: {summary['runs']} of {summary['runs'] + summary['unpredictable']} runs, "
        f"costing {summary['flops']:.3g} FLOPs"
        + ("" if hours is None else f", ~{hours:.1f} GPU-hours")
        + " (loss: the compute-optimal envelope at the run's budget; off-optimal shapes do worse)"
    )
