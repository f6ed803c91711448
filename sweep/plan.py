"""`sweep plan`: the runs a grid expands to and what they will cost."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from models.config import RunSpec


def plan_rows(runs: list[RunSpec], gpu_tflops: float = 150.0) -> list[dict[str, Any]]:
    """One row per run: shape, N, D, C = 6ND, steps, D/N and resources: processes, GPUs
    (nodes x GPUs per node), GPU-hours at ``gpu_tflops`` per GPU and the wall-clock hours
    they take spread over the run's GPUs (None for CPU runs)."""
    rows = []
    for spec in runs:
        n_params, tokens, flops = spec.n_params, spec.tokens, spec.flops
        res = spec.resources
        gpus = res.nodes * res.gpus
        gpu_hours = flops / (gpu_tflops * 1e12) / 3600
        rows.append(
            {
                "run_id": spec.run_id,
                "config": spec.label,
                "budget": spec.budget,
                "d_model": spec.model.d_model,
                "n_layers": spec.model.n_layers,
                "seed": spec.seed,
                "N": n_params,
                "D": tokens,
                "C": flops,
                "steps": spec.train.steps,
                "tokens_per_param": tokens / n_params,
                "nodes": res.nodes,
                "processes": res.world_size,
                "gpus_per_node": res.gpus,
                "gpus": gpus,
                "gpu_hours": gpu_hours if gpus else None,
                "wall_hours": gpu_hours / gpus if gpus else None,
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
        "procs",
        "GPUs",
        "GPU-h",
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
            str(row["processes"]),
            str(row["gpus"]),
            "" if row["gpu_hours"] is None else f"{row['gpu_hours']:.3g}",
        )
    console.print(table)
    dropped = ", ".join(f"{n} by {why}" for why, n in totals["dropped"].items() if n) or "none"
    console.print(
        f"total: {totals['runs']} runs, {totals['flops']:.3g} FLOPs (C = 6ND); "
        f"~{totals['gpu_hours']:.1f} GPU-hours at {totals['assumed_gpu_tflops']:g} TFLOP/s "
        f"per GPU, ~{totals['cpu_core_hours']:.2f} core-hours at "
        f"{totals['assumed_cpu_gflops']:g} GFLOP/s per core; dropped points: {dropped}"
    )
    if totals.get("calibrated_from"):
        cal = totals["calibrated_from"]
        console.print(
            f"rates measured in {cal['sweep_dir']}: median of {cal['gpu_runs']} GPU and "
            f"{cal['cpu_runs']} CPU run(s) (a kind with none keeps the assumed rate)"
        )
