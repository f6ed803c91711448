"""Figure of a held-out evaluation: observed vs predicted loss per configuration."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.configs import config_color
from analysis.figures import _log_axes, _panels, save
from analysis.laws import lower_envelope
from analysis.registry import plot
from analysis.transfer import LOSS, HeldOut

if TYPE_CHECKING:
    from analysis.report import Source


def plot_transfer(
    runs: pd.DataFrame, result: HeldOut, out_dir: Path, loss: str = LOSS, name: str = "transfer"
) -> list[Path]:
    """One panel per target: its best loss per budget, the transfer prediction with its interval,
    the own-L(C) and joint-law predictions, and the held-out region (budgets > cut-off) shaded.
    Held-out budgets whose loss exceeds the transfer interval are marked with a red cross."""
    configs = list(dict.fromkeys(result.table["config"]))
    if not configs:
        raise ValueError(f"no configuration could be predicted against {result.base}")
    fig, axes = _panels(len(configs))
    base_env = lower_envelope(runs[runs["config"] == result.base], loss)
    for ax, config in zip(axes, configs, strict=True):
        rows = result.table[result.table["config"] == config].sort_values("budget")
        env = lower_envelope(runs[runs["config"] == config], loss)
        color = config_color(config)
        ax.axvspan(result.cutoff, float(runs["budget"].max()) * 1.5, color="0.9", zorder=0)
        ax.plot(base_env["budget"], base_env[loss], color="0.5", lw=0.8, label=result.base)
        ax.scatter(env["budget"], env[loss], s=22, color=color, edgecolors="k", lw=0.5)
        x = rows["budget"].to_numpy(float)
        yerr = np.vstack(
            [rows["transfer"] - rows["transfer_lo"], rows["transfer_hi"] - rows["transfer"]]
        )
        yerr = np.nan_to_num(np.abs(yerr))
        ax.errorbar(x, rows["transfer"], yerr=yerr, color=color, capsize=2, label="transfer")
        ax.plot(x, rows["own"], "--", color="k", lw=0.8, label="own L(C)")
        ax.plot(x, rows["joint"], ":", color="k", lw=0.8, label="joint law")
        gone = rows[rows["departed"]]
        ax.scatter(gone["budget"], gone["observed"], marker="x", s=40, color="red", zorder=5)
        first = f"; departs at {gone['budget'].iloc[0]:.3g}" if len(gone) else ""
        ax.set_title(f"{config}{first}")
        _log_axes(ax)
        highest = float(np.nanmax(rows[["transfer", "transfer_hi"]].to_numpy(float)))
        top = max(float(env[loss].min()) * 1.4, highest * 1.05)
        ax.set_ylim(top=top)
        ax.set_xlabel("compute budget C")
        ax.set_ylabel(loss.replace("_", " "))
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(loc="upper right")
    fig.suptitle(
        f"Held-out test: fitted on budgets <= {result.cutoff:.3g} (shaded: predicted), "
        f"transfer L = K(L_{result.base} - E_1)^κ + E_2 with 95% bootstrap CI; "
        "red x: observed above the interval"
    )
    return save(fig, out_dir, name)


@plot("transfer", "held-out test: observed vs transfer/own/joint predictions (--base, --cutoff)")
def _plot(src: Source, out_dir: Path) -> list[Path]:
    return plot_transfer(src.runs, src.held_out, out_dir)
