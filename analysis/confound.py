"""The LN-bias confound study (``make proxy-confound``): which runs diverge, and when.

The paper's MX proxy runs differ from its FP32 runs twice over: the quantization and a
LayerNorm bias that never trains (its MX LayerNorm returns no bias gradient). The confound
grid runs the same seeds as FP32, FP32 with a frozen LN bias, MX under the paper profile and
MX with a trained LN bias; this module tabulates, per run and per configuration, whether it
diverged (the run stopped as diverged, or its loss curve diverged) and its first trouble
step (loss spike, moving-average rise or divergence; analysis.interventions.trouble_step).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.interventions import loss_curves, trouble_step
from analysis.load import run_dirs
from runfolder.atomic import read_json
from runfolder.paths import SPEC_FILE, SUMMARY_FILE

# The study's four arms, in the order they are shown.
CONFIGS = ("fp32", "fp32_frozen_ln_bias", "mx_paper", "mx_trained_ln_bias")


def confound_runs(sweep_dir: Path) -> pd.DataFrame:
    """One row per unbranched run: config, seed, state, diverged, trouble_step, losses."""
    rows = []
    for run_dir in run_dirs(sweep_dir):
        spec = read_json(run_dir / SPEC_FILE) or {}
        if not spec or spec.get("branch"):
            continue
        summary = read_json(run_dir / SUMMARY_FILE) or {}
        rows.append(
            {
                "run_id": run_dir.name,
                "config": spec.get("tags", {}).get("config", "?"),
                "seed": spec.get("seed"),
                "state": summary.get("state", "unfinished"),
                "steps_done": summary.get("steps_done"),
                "final_train_loss": summary.get("final_train_loss", np.nan),
            }
        )
    runs = pd.DataFrame(rows, columns=["run_id", "config", "seed", "state", "steps_done",
                                       "final_train_loss"])  # fmt: skip
    if not runs["config"].isin(CONFIGS).any():
        raise ValueError(
            f"{sweep_dir}: no confound runs (configs {', '.join(CONFIGS)}; see "
            "grids/proxy_confound.yaml)"
        )
    curves = loss_curves(sweep_dir, runs["run_id"].tolist())
    trouble, curve_div, min_loss = [], [], []
    for run_id in runs["run_id"]:
        curve = curves.get(run_id)
        if curve is None or curve.empty:
            trouble.append(None), curve_div.append(False), min_loss.append(np.nan)
            continue
        trouble.append(trouble_step(curve, after=0))
        curve_div.append(not np.isfinite(curve.to_numpy()).all())
        min_loss.append(float(np.nanmin(curve.to_numpy())))
    runs["trouble_step"] = pd.array(trouble, dtype="Int64")
    runs["diverged"] = (runs["state"] == "diverged") | np.array(curve_div)
    runs["min_train_loss"] = min_loss
    order = {c: i for i, c in enumerate(CONFIGS)}
    runs["_order"] = runs["config"].map(lambda c: order.get(c, len(order)))
    runs = runs.sort_values(["_order", "config", "seed"]).drop(columns="_order")
    return runs.reset_index(drop=True)


def confound_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: runs, diverged, in trouble, and when (median/min trouble step)."""
    grouped = runs.groupby("config", sort=False)
    table = pd.DataFrame(
        {
            "runs": grouped.size(),
            "diverged": grouped["diverged"].sum().astype(int),
            "in_trouble": grouped["trouble_step"].count(),
            "first_trouble_step": grouped["trouble_step"].min(),
            "median_trouble_step": grouped["trouble_step"].median(),
            "median_final_train_loss": grouped["final_train_loss"].median(),
        }
    )
    return table.reset_index()


def plot_confound(sweep_dir: Path, runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Train loss per seed (one panel each), one line per configuration."""
    from matplotlib import pyplot as plt

    from analysis.figures import save

    curves = loss_curves(sweep_dir, runs["run_id"].tolist())
    seeds = sorted(runs["seed"].dropna().unique())
    fig, axes = plt.subplots(
        1, len(seeds), figsize=(4.5 * len(seeds), 3.4), squeeze=False, constrained_layout=True
    )
    for ax, seed in zip(axes[0], seeds, strict=True):
        for row in runs[runs["seed"] == seed].itertuples():
            curve = curves.get(row.run_id)
            if curve is not None:
                ax.plot(curve.index, curve.to_numpy(), label=row.config, lw=1)
        ax.set(title=f"seed {seed}", xlabel="step", ylabel="train loss", yscale="log")
    axes[0][0].legend(fontsize=7)
    return save(fig, out_dir, "confound")
