"""`sweep plan`: the runs a grid expands to and what they will cost."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from models.config import RunSpec


def plan_rows(runs: list[RunSpec]) -> list[dict[str, Any]]:
    """One row per run: shape, N, D, C = 6ND, steps, D/N and resources."""
    rows = []
    for spec in runs:
        n_params = spec.model.param_count()
        tokens = spec.train.steps * spec.tokens_per_step
        rows.append(
            {
                "run_id": spec.run_id,
                "config": spec.tags.get("config", spec.precision.label),
                "budget": spec.budget,
                "d_model": spec.model.d_model,
                "n_layers": spec.model.n_layers,
                "seed": spec.seed,
                "N": n_params,
                "D": tokens,
                "C": 6.0 * n_params * tokens,
                "steps": spec.train.steps,
                "tokens_per_param": tokens / n_params,
                "gpus": spec.resources.gpus,
                "nodes": spec.resources.nodes,
            }
        )
    return rows


def render_plan(rows: list[dict[str, Any]], totals: dict[str, Any], console: Console) -> None:
    table = Table(title=f"{len(rows)} runs", title_justify="left")
    for column in (
        "run_id",
        "config",
        "budget",
        "d_model",
        "layers",
        "seed",
        "N",
        "D",
        "C",
        "steps",
        "D/N",
    ):
        table.add_column(column, justify="left" if column in ("run_id", "config") else "right")
    for row in rows:
        table.add_row(
            row["run_id"],
            row["config"],
            "" if row["budget"] is None else f"{row['budget']:.3g}",
            str(row["d_model"]),
            str(row["n_layers"]),
            str(row["seed"]),
            f"{row['N']:,}",
            f"{row['D']:,}",
            f"{row['C']:.3g}",
            str(row["steps"]),
            f"{row['tokens_per_param']:.1f}",
        )
    console.print(table)
    dropped = ", ".join(f"{n} by {why}" for why, n in totals["dropped"].items() if n) or "none"
    console.print(
        f"total: {totals['runs']} runs, {totals['flops']:.3g} FLOPs (C = 6ND); "
        f"~{totals['gpu_hours']:.1f} GPU-hours at {totals['assumed_gpu_tflops']:g} TFLOP/s "
        f"per GPU, ~{totals['cpu_core_hours']:.2f} core-hours at "
        f"{totals['assumed_cpu_gflops']:g} GFLOP/s per core; dropped points: {dropped}"
    )
