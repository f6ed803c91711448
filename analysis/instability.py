"""Instability detectors for single curves and per-run / per-configuration summaries.

Defaults (all configurable):
- Spikes: a point is a spike when it exceeds mean + ``z`` * std of the previous ``window``
  points (olmo-core style; nothing is flagged until the window is full). ``z=6``,
  ``window=50`` logged points (500 steps at the default log_every=10). Flagged points closer
  than ``merge_gap`` points form one event.
- Onset: the paper's heuristic, the ``ma_window``-point moving average of train loss rising
  by more than ``ma_slope`` (0.008) per logged point.
- Divergence: NaN/Inf or a loss above the first logged loss.
- Non-recovery: final - best validation loss > ``tau`` (0.05 separates the paper's runs).
The paper's curves file has only 20-65 points per run; use window ~10 and ma_window ~5 there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Thresholds:
    """Detector parameters (see module docstring for the defaults' rationale)."""

    window: int = 50
    z: float = 6.0
    merge_gap: int = 5
    ma_window: int = 100
    ma_slope: float = 0.008
    var_window: int = 100
    tau: float = 0.05
    # Divergence counts only after the loss first fell below settle_frac x its initial value
    # (None: from the start). Per-step curves wobble above their first value early on.
    settle_frac: float | None = None

    def __post_init__(self) -> None:
        for name in ("window", "merge_gap", "ma_window", "var_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.z <= 0 or self.ma_slope <= 0 or self.tau < 0:
            raise ValueError(f"z and ma_slope must be > 0 and tau >= 0, got {self}")


DEFAULT = Thresholds()


def spike_mask(values, window: int = DEFAULT.window, z: float = DEFAULT.z) -> np.ndarray:
    """Boolean mask: value > mean + z*std of the previous ``window`` finite values."""
    series = pd.Series(np.asarray(values, float)).replace([np.inf, -np.inf], np.nan)
    prior = series.shift(1).rolling(window, min_periods=window)
    threshold = prior.mean() + z * prior.std()
    return (series > threshold).to_numpy()


def spike_events(
    values, window: int = DEFAULT.window, z: float = DEFAULT.z, merge_gap: int = DEFAULT.merge_gap
) -> list[tuple[int, int]]:
    """Spike events as (first index, last index), merging flags closer than ``merge_gap``."""
    events: list[tuple[int, int]] = []
    for i in np.flatnonzero(spike_mask(values, window, z)):
        if events and i - events[-1][1] <= merge_gap:
            events[-1] = (events[-1][0], int(i))
        else:
            events.append((int(i), int(i)))
    return events


def ma_onset(loss, window: int = DEFAULT.ma_window, slope: float = DEFAULT.ma_slope) -> int | None:
    """First index where the moving average of ``loss`` rises by more than ``slope`` per point."""
    ma = pd.Series(np.asarray(loss, float)).rolling(window, min_periods=window).mean()
    hits = np.flatnonzero((ma.diff() > slope).to_numpy())
    return int(hits[0]) if len(hits) else None


def divergence_index(loss, settle_frac: float | None = None) -> int | None:
    """First index where the loss is NaN/Inf or above its first finite value (with
    ``settle_frac``: only after it first fell below settle_frac x that value)."""
    values = np.asarray(loss, float)
    finite = np.isfinite(values)
    if not finite.any():
        return 0 if len(values) else None
    initial = values[np.argmax(finite)]
    bad = ~finite | (values > initial)
    bad[: np.argmax(finite)] = False
    if settle_frac is not None:
        settled = np.flatnonzero(finite & (values < settle_frac * initial))
        bad[: settled[0] if len(settled) else len(values)] = False
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else None


def rolling_variance(values, window: int = DEFAULT.var_window) -> np.ndarray:
    """Rolling variance of e.g. the grad norm (the paper's second heuristic)."""
    return pd.Series(np.asarray(values, float)).rolling(window, min_periods=window).var().to_numpy()


def curve_instability(
    loss, grad_norm=None, steps=None, tokens=None, thresholds: Thresholds = DEFAULT
) -> dict[str, float | int | bool | None]:
    """Per-run instability facts from a train-loss curve (and optionally grad norm).

    ``steps``/``tokens`` map point indices onto training steps/tokens (default: the index).
    """
    loss = np.asarray(loss, float)
    steps = np.arange(len(loss)) if steps is None else np.asarray(steps)
    tokens = steps if tokens is None else np.asarray(tokens)
    t = thresholds
    loss_events = spike_events(loss, t.window, t.z, t.merge_gap)
    onset = ma_onset(loss, t.ma_window, t.ma_slope)
    div = divergence_index(loss, t.settle_frac)
    out: dict[str, float | int | bool | None] = {
        "n_loss_spikes": len(loss_events),
        "first_spike_step": int(steps[loss_events[0][0]]) if loss_events else None,
        "onset_step": int(steps[onset]) if onset is not None else None,
        "onset_tokens": int(tokens[onset]) if onset is not None else None,
        "curve_diverged": div is not None,
        "diverged_at_step": int(steps[div]) if div is not None else None,
        "n_grad_spikes": 0,
        "max_grad_var": np.nan,
    }
    if grad_norm is not None and len(grad_norm):
        out["n_grad_spikes"] = len(spike_events(grad_norm, t.window, t.z, t.merge_gap))
        var = rolling_variance(grad_norm, min(t.var_window, len(grad_norm)))
        out["max_grad_var"] = float(np.nanmax(var)) if np.isfinite(var).any() else np.nan
    return out


def _curve_rows(metrics: pd.DataFrame, thresholds: Thresholds) -> pd.DataFrame:
    loss = metrics[metrics["name"] == "train/loss"].sort_values(["run_id", "step"])
    grads = metrics[metrics["name"] == "optim/grad_norm"].sort_values(["run_id", "step"])
    grad_by_run = {rid: g["value"].to_numpy() for rid, g in grads.groupby("run_id", observed=True)}
    rows = []
    for rid, g in loss.groupby("run_id", observed=True):
        tokens = g["tokens"].to_numpy() if "tokens" in g else None
        facts = curve_instability(
            g["value"].to_numpy(), grad_by_run.get(rid), g["step"].to_numpy(), tokens, thresholds
        )
        rows.append({"run_id": str(rid), **facts})
    return pd.DataFrame(rows)


def classify_runs(
    runs: pd.DataFrame, metrics: pd.DataFrame | None = None, thresholds: Thresholds = DEFAULT
) -> pd.DataFrame:
    """Add instability columns to a tidy run frame.

    Adds ``has_result`` (the run produced a validation loss or diverged), ``diverged``,
    ``final_minus_best``, ``non_recovery`` and ``unstable`` (diverged or non-recovery or a
    moving-average onset), plus the curve facts of :func:`curve_instability` when step
    metrics are given.
    """
    out = runs.copy()
    final = out["final_val_loss"].astype(float)
    out["final_minus_best"] = final - out["min_val_loss"].astype(float)
    # NaN (no min logged) means "unknown", which must not count as unstable.
    out["non_recovery"] = (out["final_minus_best"] > thresholds.tau).fillna(False).astype(bool)
    state = out["state"]
    out["diverged"] = (state == "diverged") | ((state == "done") & ~np.isfinite(final))
    out["has_result"] = (state == "diverged") | np.isfinite(final) | out["diverged"]
    onset = pd.Series(False, index=out.index)
    if metrics is not None and len(metrics):
        facts = _curve_rows(metrics, thresholds)
        if len(facts):
            out = out.merge(facts, on="run_id", how="left")
            out["diverged"] |= out["curve_diverged"].astype("boolean").fillna(False).astype(bool)
            onset = out["onset_step"].notna()
    out["unstable"] = out["diverged"] | out["non_recovery"] | onset.to_numpy()
    return out


def frequency_table(
    classified: pd.DataFrame, by: tuple[str, ...] = ("config", "budget")
) -> pd.DataFrame:
    """Unstable / total runs (with a result) per group, with the fraction and onset spread."""
    missing = [c for c in by if c not in classified]
    if missing:
        raise ValueError(f"cannot group by {missing}; columns are {list(classified.columns)}")
    done = classified[classified["has_result"]]
    agg = {"unstable": ("unstable", "sum"), "total": ("unstable", "size")}
    if "onset_step" in done:
        agg["median_onset_step"] = ("onset_step", "median")
    table = done.groupby(list(by), observed=True).agg(**agg).reset_index()
    table["unstable"] = table["unstable"].astype(int)
    table["fraction"] = table["unstable"] / table["total"]
    return table
