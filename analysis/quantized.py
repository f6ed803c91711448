"""Validation loss of the quantized model (weights cast to the target format) vs compute,
one line per configuration: plain training, QAT and LOTION side by side (torch-free)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.configs import config_color, config_order
from analysis.figures import _log_axes, plt, save
from analysis.registry import plot

if TYPE_CHECKING:
    from analysis.report import Source

LOSS = "final_val_loss_quantized"


def quantized_envelope(runs: pd.DataFrame) -> pd.DataFrame:
    """Best quantized and unquantized final validation loss per configuration and budget."""
    done = runs[runs[LOSS].notna()] if LOSS in runs else runs.iloc[0:0]
    if done.empty:
        raise ValueError(
            "no run recorded val/loss_quantized: set train.quantized_eval (or train.lotion)"
        )
    keys = ["config", "flops"]
    return done.groupby(keys, as_index=False)[[LOSS, "final_val_loss"]].min().sort_values(keys)


def plot_quantized(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Quantized (solid) and full-precision (dotted) validation loss vs training FLOPs."""
    table = quantized_envelope(runs)
    fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
    for config in config_order(set(table["config"])):
        sub = table[table["config"] == config]
        color = config_color(config)
        ax.plot(sub["flops"], sub[LOSS], "o-", color=color, label=config)
        ax.plot(sub["flops"], sub["final_val_loss"], ":", color=color, alpha=0.7)
    _log_axes(ax)
    ax.set_xlabel("training FLOPs C")
    ax.set_ylabel("final validation loss (nats/token)")
    ax.set_title("Quantized-weight validation loss (solid) vs unquantized (dotted)")
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    return save(fig, out_dir, "quantized")


@plot(
    "quantized",
    "quantized-weight vs unquantized val loss over compute (runs with train.quantized_eval)",
)
def _plot(src: Source, out_dir: Path) -> list[Path]:
    return plot_quantized(src.runs, out_dir)
