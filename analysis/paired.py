"""Paired FP32/MX proxy runs: both losses, the gradient bias and the clip rates over steps.

This is the mechanism view of the paper's proxy study: whether the MX run's loss departs
from its FP32 twin's, and whether that follows a growing gradient bias (ζ, 1 − cos) and
clipping of LayerNorm weights or GEMM inputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.load import load_metrics
from analysis.registry import Needs, plot, table

if TYPE_CHECKING:
    from analysis.report import Source

MAX_RUNS = 8
_LOSSES = ("train/loss", "paired/fp32_loss")
_BIAS = ("paired/grad_zeta", "paired/grad_cos")
# Losses, gradient bias and clip rates (LN weights, fc1 inputs): all the paired views read.
NEEDS = Needs(
    metrics=_LOSSES + _BIAS,
    metric_suffixes=("/weight_clip", ".fc1/a"),
    columns=("run_id", "step", "name", "value"),
    sweep_only=True,
)


def paired_metrics(sweep_dir: Path) -> pd.DataFrame:
    """Wide step metrics (index run_id, step) of the paired runs, or an empty frame."""
    metrics = load_metrics(
        sweep_dir, NEEDS.metrics, suffixes=NEEDS.metric_suffixes, columns=NEEDS.columns
    )
    if metrics.empty:
        return pd.DataFrame()
    metrics["name"] = metrics["name"].astype(str)
    paired_ids = metrics.loc[metrics["name"] == "paired/fp32_loss", "run_id"].unique()
    metrics = metrics[metrics["run_id"].isin(paired_ids)]
    if metrics.empty:
        return pd.DataFrame()
    metrics["run_id"] = metrics["run_id"].astype(str)
    return metrics.pivot_table(index=["run_id", "step"], columns="name", values="value")


def plot_paired(sweep_dir: Path, out_dir: Path) -> list[Path]:
    """One row per paired, unbranched run (at most MAX_RUNS): losses, gradient bias, clip
    rates."""
    from matplotlib import pyplot as plt

    from analysis.figures import save

    wide = paired_metrics(sweep_dir)
    if wide.empty:
        raise ValueError(f"{sweep_dir}: no paired runs (proxy runs with model.paired: true)")
    from analysis.load import load_sweep_runs

    runs = load_sweep_runs(sweep_dir)
    own = set(runs.loc[runs["parent"].isna(), "run_id"])
    run_ids = sorted(set(wide.index.get_level_values("run_id")) & own)[:MAX_RUNS]
    fig, axes = plt.subplots(
        len(run_ids), 3, figsize=(13, 2.8 * len(run_ids)), squeeze=False, constrained_layout=True
    )
    for row, run_id in zip(axes, run_ids, strict=True):
        run = wide.loc[run_id]
        steps = run.index.to_numpy()
        loss_ax, bias_ax, clip_ax = row
        loss_ax.plot(steps, run["train/loss"], lw=1, label="MX")
        loss_ax.plot(steps, run["paired/fp32_loss"], lw=1, label="FP32 twin")
        loss_ax.set_yscale("log")
        loss_ax.set_title(f"{run_id}: train loss")
        # Floored so an exact twin (zero bias) still draws on the log axis.
        bias_ax.plot(steps, np.maximum(np.abs(run["paired/grad_zeta"]), 1e-12), lw=0.8, label="|ζ|")
        bias_ax.plot(steps, np.maximum(1 - run["paired/grad_cos"], 1e-12), lw=0.8, label="1 − cos")
        bias_ax.set_yscale("log")
        bias_ax.set_title("gradient bias MX vs FP32")
        for name in sorted(c for c in run.columns if c.endswith(("/weight_clip", ".fc1/a"))):
            series = run[name].dropna()
            label = name.replace("mx/clip/", "").replace("ln/", "")
            clip_ax.plot(series.index, series.to_numpy(), lw=0.8, label=label)
        clip_ax.set_title("clip rate (LN weight, fc1 input)")
        for ax in row:
            ax.set_xlabel("step")
            ax.legend(fontsize=6)
    return save(fig, out_dir, "paired")


def paired_table(sweep_dir: Path) -> pd.DataFrame:
    """Per paired (unbranched) run: final MX and FP32 losses, when each got into trouble
    (first spike, onset or divergence; analysis.interventions.trouble_step) and which did."""
    from analysis.interventions import trouble_step
    from analysis.load import load_sweep_runs

    wide = paired_metrics(sweep_dir)
    if wide.empty:
        raise ValueError(f"{sweep_dir}: no paired runs (proxy runs with model.paired: true)")
    runs = load_sweep_runs(sweep_dir).set_index("run_id")
    rows = []
    for run_id, run in wide.groupby(level="run_id"):
        if isinstance(runs.loc[run_id, "parent"], str):
            continue  # branches are judged in the interventions table
        run = run.droplevel("run_id")
        mx_trouble = trouble_step(run["train/loss"].dropna(), after=0)
        fp32_trouble = trouble_step(run["paired/fp32_loss"].dropna(), after=0)
        info = runs.loc[run_id]
        rows.append(
            {
                "run_id": run_id,
                "config": info["config"],
                "seed": info["seed"],
                "d_model": info["d_model"],
                "n_layers": info["n_layers"],
                "steps": int(run.index.max()),
                "mx_final_loss": float(run["train/loss"].dropna().iloc[-1]),
                "fp32_final_loss": float(run["paired/fp32_loss"].dropna().iloc[-1]),
                "mx_trouble_step": mx_trouble,
                "fp32_trouble_step": fp32_trouble,
                "max_abs_zeta": float(np.nanmax(np.abs(run["paired/grad_zeta"]))),
                "verdict": _verdict(mx_trouble, fp32_trouble),
            }
        )
    return pd.DataFrame(rows).astype({"mx_trouble_step": float, "fp32_trouble_step": float})


def _verdict(mx_trouble: int | None, fp32_trouble: int | None) -> str:
    if mx_trouble is None:
        return "stable" if fp32_trouble is None else "fp32 only"
    if fp32_trouble is None:
        return "mx only"
    return "both (mx first)" if mx_trouble < fp32_trouble else "both"


@plot("paired", "paired FP32/MX runs: both losses, gradient bias, clip rates", NEEDS, "paired")
def _plot(src: Source, out_dir: Path) -> list[Path]:
    return plot_paired(src.sweep_folder("plot 'paired'"), out_dir)


@table("paired", "paired FP32/MX runs: final losses and which got into trouble", NEEDS, "paired")
def _table(src: Source, out_dir: Path) -> list[Path]:
    from analysis.tables import write_table

    frame = paired_table(src.sweep_folder("table 'paired'"))
    title = "Paired FP32/MX runs: final losses and which one got into trouble"
    return write_table(frame, out_dir, "paired", title)
