"""Validation loss of the quantized model (weights cast to the target format) vs compute:
one panel per target format (INT4, INT8, FP4, ...), plain training, QAT and LOTION side
by side in each (torch-free)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.figures import _log_axes, plt, save
from analysis.registry import plot

if TYPE_CHECKING:
    from analysis.report import Source

LOSS = "final_val_loss_quantized"
METHODS = ("plain", "QAT", "LOTION")
METHOD_COLORS = {"plain": "tab:gray", "QAT": "tab:blue", "LOTION": "tab:red"}


def training_method(runs: pd.DataFrame) -> pd.Series:
    """LOTION when the run smoothed towards its evaluation format, QAT when its forward
    weights were already in it (straight-through fake quantization), else plain."""
    target = runs["quantized_eval"]
    lotion = runs["lotion"].notna() if "lotion" in runs else pd.Series(False, index=runs.index)
    qat = runs["w_fmt"] == target
    return pd.Series(np.where(lotion, "LOTION", np.where(qat, "QAT", "plain")), index=runs.index)


def quantized_envelope(runs: pd.DataFrame) -> pd.DataFrame:
    """Best quantized and unquantized final validation loss per target format, method,
    configuration and budget."""
    done = runs[runs[LOSS].notna()] if LOSS in runs else runs.iloc[0:0]
    if done.empty:
        raise ValueError(
            "no run recorded val/loss_quantized: set train.quantized_eval (or train.lotion)"
        )
    # A loss without its format (a summary older than the quantized_eval column): "?".
    formats = done.get("quantized_eval")
    done = done.assign(quantized_eval="?" if formats is None else formats.fillna("?"))
    done = done.assign(method=training_method(done))
    keys = ["quantized_eval", "method", "config", "flops"]
    table = done.groupby(keys, as_index=False)[[LOSS, "final_val_loss"]].min()
    return table.sort_values(keys).reset_index(drop=True)


def plot_quantized(runs: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Quantized (solid) and full-precision (dotted) validation loss vs training FLOPs, a
    panel per target format."""
    table = quantized_envelope(runs)
    formats = sorted(table["quantized_eval"].unique())
    fig, axes = plt.subplots(
        1,
        len(formats),
        figsize=(4.2 * len(formats) + 1, 4.5),
        constrained_layout=True,
        squeeze=False,
        sharey=True,
    )
    for ax, fmt in zip(axes[0], formats, strict=True):
        panel = table[table["quantized_eval"] == fmt]
        for method in METHODS:
            color = METHOD_COLORS[method]
            for config, sub in panel[panel["method"] == method].groupby("config"):
                ax.plot(sub["flops"], sub[LOSS], "o-", color=color, label=f"{method}: {config}")
                ax.plot(sub["flops"], sub["final_val_loss"], ":", color=color, alpha=0.7)
        _log_axes(ax)
        ax.set_title(f"weights cast to {fmt}")
        ax.set_xlabel("training FLOPs C")
        ax.legend(loc="upper right", fontsize=7)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("final validation loss (nats/token)")
    fig.suptitle("Quantized-weight validation loss (solid) vs unquantized (dotted)")
    return save(fig, out_dir, "quantized")


@plot(
    "quantized",
    "quantized-weight vs unquantized val loss over compute (runs with train.quantized_eval)",
)
def _plot(src: Source, out_dir: Path) -> list[Path]:
    return plot_quantized(src.runs, out_dir)
