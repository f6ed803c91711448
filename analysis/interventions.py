"""Intervention outcomes: branched runs (``sweep intervene``) judged against their parent.

An arm's curve is read as the parent's curve up to the branch step followed by the arm's
own steps, so the detectors see the same history the parent had. Its "trouble step" (first
loss spike, moving-average onset or divergence once the loss has settled; trouble_step) is
compared with the parent's:

- parent in trouble after the branch step: the arm ``diverged`` (its trouble comes at most
  DELAY_FRACTION of the branch-to-trouble distance later than the parent's: step-level noise
  is not a delay), is ``delayed`` (later than that) or ``averted`` it (none through its end);
- parent without trouble after the branch step: the arm is ``stable`` or ``diverged``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.instability import Thresholds, curve_instability
from analysis.load import load_metrics, run_dirs
from runfolder.atomic import read_json
from runfolder.paths import SPEC_FILE, SUMMARY_FILE

OUTCOMES = ("diverged", "delayed", "averted", "stable")
DELAY_FRACTION = 0.25
# Per-step curves: spikes and divergence are judged once the loss has settled (see
# Thresholds.settle_frac); windows shrink to the curve for short runs (trouble_step).
CURVE_THRESHOLDS = Thresholds(settle_frac=0.5)


def load_branches(sweep_dir: Path) -> pd.DataFrame:
    """One row per branched run: run_id, parent, step, arm and its summary's losses."""
    rows = []
    for run_dir in run_dirs(sweep_dir):
        spec = read_json(run_dir / SPEC_FILE) or {}
        branch = spec.get("branch")
        if not branch:
            continue
        summary = read_json(run_dir / SUMMARY_FILE) or {}
        rows.append(
            {
                "run_id": run_dir.name,
                "parent": branch["parent"],
                "branch_step": int(branch["step"]),
                "arm": branch["arm"],
                "state": summary.get("state", "unfinished"),
                "steps_done": summary.get("steps_done"),
                "final_val_loss": summary.get("final_val_loss"),
            }
        )
    columns = ["run_id", "parent", "branch_step", "arm", "state", "steps_done", "final_val_loss"]
    return pd.DataFrame(rows, columns=columns)


def loss_curves(sweep_dir: Path, run_ids: list[str]) -> dict[str, pd.Series]:
    """Train loss by step for each run (runs without metrics are left out)."""
    metrics = load_metrics(sweep_dir, names=["train/loss"], run_ids=run_ids)
    curves = {}
    for run_id, group in metrics.groupby("run_id", observed=True):
        curves[str(run_id)] = group.set_index("step")["value"].sort_index()
    return curves


def spliced(parent: pd.Series, arm: pd.Series, step: int) -> pd.Series:
    """The parent's curve up to ``step`` followed by the arm's curve after it."""
    return pd.concat([parent[parent.index <= step], arm[arm.index > step]])


def trouble_step(
    curve: pd.Series, after: int, thresholds: Thresholds = CURVE_THRESHOLDS
) -> int | None:
    """First instability sign strictly after step ``after`` (None when there is none)."""
    window = min(thresholds.window, max(2, len(curve) // 4))
    ma_window = min(thresholds.ma_window, max(2, len(curve) // 4))
    t = Thresholds(**{**thresholds.__dict__, "window": window, "ma_window": ma_window})
    facts = curve_instability(curve.to_numpy(), steps=curve.index.to_numpy(), thresholds=t)
    later = [
        int(facts[k])
        for k in ("first_spike_step", "onset_step", "diverged_at_step")
        if facts[k] is not None and facts[k] > after
    ]
    return min(later) if later else None


def classify(parent_trouble: int | None, arm_trouble: int | None, branch_step: int) -> str:
    """An arm's outcome from its own and its parent's trouble steps (see module docstring)."""
    if parent_trouble is None:
        return "stable" if arm_trouble is None else "diverged"
    if arm_trouble is None:
        return "averted"
    margin = max(1.0, DELAY_FRACTION * (parent_trouble - branch_step))
    return "delayed" if arm_trouble > parent_trouble + margin else "diverged"


def outcome_table(sweep_dir: Path, thresholds: Thresholds = CURVE_THRESHOLDS) -> pd.DataFrame:
    """Each arm's outcome, trouble step and final loss, with the parent's for comparison."""
    branches = load_branches(sweep_dir)
    if branches.empty:
        raise ValueError(f"{sweep_dir}: no branched runs; create some with `sweep intervene`")
    ids = sorted(set(branches["run_id"]) | set(branches["parent"]))
    curves = loss_curves(sweep_dir, ids)
    rows = []
    for row in branches.itertuples(index=False):
        parent = curves.get(row.parent)
        arm = curves.get(row.run_id)
        if parent is None or arm is None:
            continue
        parent_trouble = trouble_step(parent, row.branch_step, thresholds)
        arm_trouble = trouble_step(
            spliced(parent, arm, row.branch_step), row.branch_step, thresholds
        )
        finished = row.state in ("done", "diverged")
        rows.append(
            {
                "parent": row.parent,
                "branch_step": row.branch_step,
                "arm": row.arm,
                "run_id": row.run_id,
                "outcome": (
                    classify(parent_trouble, arm_trouble, row.branch_step)
                    if finished
                    else "running"
                ),
                "parent_trouble_step": parent_trouble,
                "arm_trouble_step": arm_trouble,
                "final_train_loss": float(arm.iloc[-1]),
                "parent_final_train_loss": float(parent.iloc[-1]),
                "final_val_loss": row.final_val_loss,
                "last_step": int(arm.index[-1]),
            }
        )
    table = pd.DataFrame(rows)
    for column in ("parent_trouble_step", "arm_trouble_step"):
        if column in table:  # NaN (no trouble) prints as an empty cell
            table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
    if table.empty:
        raise ValueError(f"{sweep_dir}: branched runs have no metrics yet")
    return table.sort_values(["parent", "branch_step", "arm"]).reset_index(drop=True)


def plot_interventions(sweep_dir: Path, table: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Per (parent, branch step): the parent's loss with every arm overlaid from the branch."""
    from analysis.figures import _panels, save

    groups = list(table.groupby(["parent", "branch_step"], sort=True))
    ids = sorted(set(table["run_id"]) | set(table["parent"]))
    curves = loss_curves(sweep_dir, ids)
    fig, axes = _panels(len(groups), ncols=2, size=(5.0, 3.4))
    arms = sorted(table["arm"].unique())
    colors = dict(zip(arms, _arm_colors(len(arms)), strict=True))
    for ax, ((parent_id, step), group) in zip(axes, groups, strict=True):
        parent = curves[parent_id]
        ax.plot(parent.index, parent.to_numpy(), color="black", lw=1.4, label="parent")
        for arm in group.itertuples(index=False):
            curve = curves[arm.run_id]
            ax.plot(
                curve.index,
                curve.to_numpy(),
                color=colors[arm.arm],
                lw=0.9,
                alpha=0.85,
                label=f"{arm.arm} ({arm.outcome})",
            )
        ax.axvline(step, color="grey", ls="--", lw=0.8)
        trouble = group["parent_trouble_step"].dropna()
        if len(trouble):
            ax.axvline(float(trouble.iloc[0]), color="red", ls=":", lw=0.8)
        positive = parent[parent > 0]
        if len(positive) and positive.max() / positive.min() > 20:
            ax.set_yscale("log")
        ax.set_title(f"parent {parent_id}, branched at step {step}")
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
        ax.legend(loc="upper right", ncol=1)
    return save(fig, out_dir, "interventions")


def _arm_colors(n: int) -> list:
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def outcome_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Arms x outcomes counts across parents and branch steps."""
    counts = pd.crosstab(table["arm"], table["outcome"])
    for outcome in OUTCOMES:
        if outcome not in counts:
            counts[outcome] = 0
    return counts[list(OUTCOMES)].reset_index().astype({o: int for o in OUTCOMES})


def describe(table: pd.DataFrame) -> str:
    """A one-paragraph summary of which arms averted the parent's trouble."""
    troubled = table[table["parent_trouble_step"].notna()]
    if troubled.empty:
        return "No parent showed an instability after its branch step."
    averted = sorted(troubled.loc[troubled["outcome"] == "averted", "arm"].unique())
    delayed = sorted(troubled.loc[troubled["outcome"] == "delayed", "arm"].unique())
    return (
        f"Averted: {', '.join(averted) or 'none'}. Delayed: {', '.join(delayed) or 'none'}. "
        f"(over {len(troubled)} arm run(s) of {troubled['parent'].nunique()} troubled parent(s); "
        f"median parent trouble step {np.median(troubled['parent_trouble_step']):.0f})"
    )
