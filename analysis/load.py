"""Load runs into one tidy frame (sweep folders and the paper's table) and step metrics.

Tidy run frame, one row per run: run_id, config, w_fmt, a_fmt, variant, n_params (N),
tokens (D), flops (C actually trained), budget (the grid's C), ratio (D/N), final_val_loss,
min_val_loss, state, d_model, n_layers, seed, source ("paper" | "sweep").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from analysis.configs import parse_config
from runfolder.atomic import read_json
from runfolder.label import config_label
from runfolder.metrics import GRAD_NORM, METRIC_COLUMNS, TRAIN_LOSS, metrics_schema
from runfolder.paths import RunPaths, visible

RUN_COLUMNS = (
    "run_id",
    "config",
    "w_fmt",
    "a_fmt",
    "variant",
    "n_params",
    "tokens",
    "flops",
    "budget",
    "ratio",
    "final_val_loss",
    "min_val_loss",
    "state",
    "d_model",
    "n_layers",
    "seed",
    "source",
)
# The paper logs "finished/crashed/running"; map onto this project's run states.
_PAPER_STATES = {"finished": "done", "crashed": "failed", "running": "running"}


def _data_path(name: str) -> Path:
    return Path(str(resources.files("analysis") / "data" / name))


def _finish(frame: pd.DataFrame) -> pd.DataFrame:
    """Derive format/variant columns from the config name and order the columns."""
    spec_w = frame["w_fmt"] if "w_fmt" in frame else [None] * len(frame)
    spec_a = frame["a_fmt"] if "a_fmt" in frame else [None] * len(frame)
    parsed = [_config_columns(*row) for row in zip(frame["config"], spec_w, spec_a, strict=True)]
    frame["config"], frame["w_fmt"], frame["a_fmt"], frame["variant"] = (
        list(column) for column in zip(*parsed, strict=True)
    )
    frame["ratio"] = frame["tokens"] / frame["n_params"]
    extra = [c for c in frame.columns if c not in RUN_COLUMNS]
    return frame[list(RUN_COLUMNS) + extra].reset_index(drop=True)


def _config_columns(name: str, w_fmt: str | None, a_fmt: str | None) -> tuple[str, str, str, str]:
    """(config, w_fmt, a_fmt, variant) of a paper-style name; a sweep's free-form name (e.g.
    "mx_e4m3") is kept, with the formats of its run spec and an empty variant."""
    try:
        parsed = parse_config(name)
    except ValueError:
        if w_fmt is None or a_fmt is None:  # nothing to fall back on (the paper's table)
            raise
        return name, w_fmt, a_fmt, ""
    return parsed.name, parsed.w_fmt, parsed.a_fmt, parsed.variant


def load_paper_runs(path: Path | None = None) -> pd.DataFrame:
    """The paper's published run table (shipped in analysis/data) as a tidy run frame."""
    raw = pd.read_csv(path or _data_path("runs.csv"))
    budget = raw["total_flops"].astype(float)
    frame = pd.DataFrame(
        {
            "run_id": [f"paper-{i:04d}" for i in range(len(raw))],
            "config": raw["config"],
            "n_params": raw["params"].astype(float),
            "tokens": raw["tokens"].astype(float),
            "flops": 6.0 * raw["params"].astype(float) * raw["tokens"].astype(float),
            # total_flops carries float noise (2.0912791051825398e18 vs ...540000).
            "budget": budget.map(lambda c: float(f"{c:.4g}")),
            "final_val_loss": raw["val_loss"].astype(float),
            "min_val_loss": raw["min_val_loss"].astype(float),
            "state": raw["state"].map(lambda s: _PAPER_STATES.get(s, s)),
            "d_model": raw["d_model"].astype(int),
            "n_layers": raw["n_layers"].astype(int),
            "seed": 0,
            "source": "paper",
        }
    )
    return _finish(frame)


def load_paper_curves(path: Path | None = None) -> pd.DataFrame:
    """The paper's 48 logged curves as a long metrics frame (train/loss, optim/grad_norm).

    The file has one value per logged point and no step column, so ``step`` is the point's
    index; ``ratio`` (tokens/params) and ``config`` come from the file.
    """
    raw = pd.read_csv(path or _data_path("train_curves.csv"))
    parts = []
    for row in raw.itertuples(index=False):
        for column, name in (("loss_curve", TRAIN_LOSS), ("grad_norm_curve", GRAD_NORM)):
            values = np.asarray(json.loads(getattr(row, column)), dtype=float)
            parts.append(
                pd.DataFrame(
                    {
                        "run_id": row.run_id,
                        "step": np.arange(len(values)),
                        "name": name,
                        "value": values,
                        "ratio": float(row.ratio),
                        "config": parse_config(row.run_name).name,
                    }
                )
            )
    return pd.concat(parts, ignore_index=True)


def _sweep_run_row(run_dir: Path) -> dict:
    paths = RunPaths(run_dir)
    spec = read_json(paths.spec) or {}
    state = read_json(paths.state) or {}
    summary = read_json(paths.summary) or {}
    if not spec and not summary:
        raise ValueError(f"{run_dir} has neither spec.json nor summary.json")
    precision = spec.get("precision", {})
    config = summary.get("config") or config_label(spec)
    model = spec.get("model", {})
    return {
        "run_id": summary.get("run_id", run_dir.name),
        "config": config,
        "n_params": float(summary.get("n_params", np.nan)),
        "tokens": float(summary.get("tokens", np.nan)),
        "flops": float(summary.get("flops", np.nan)),
        "budget": float(summary.get("budget") or spec.get("budget") or np.nan),
        "final_val_loss": _float(summary.get("final_val_loss")),
        "min_val_loss": _float(summary.get("min_val_loss")),
        "final_val_loss_quantized": _float(summary.get("final_val_loss_quantized")),
        "state": summary.get("state") or state.get("state", "pending"),
        "d_model": summary.get("d_model", model.get("d_model")),
        "n_layers": summary.get("n_layers", model.get("n_layers")),
        "seed": summary.get("seed", spec.get("seed", 0)),
        "w_fmt": precision.get("w_fmt", "fp32"),
        "a_fmt": precision.get("a_fmt", "fp32"),
        "kind": model.get("kind", "lm"),
        "parent": (spec.get("branch") or {}).get("parent"),
        "source": "sweep",
        "diverged_step": _float(summary.get("diverged_step")),
        "initial_loss": _float(summary.get("initial_loss")),
        # The synthetic source's true entropy rate (None for file corpora and the proxy).
        "entropy_rate": _float(summary.get("entropy_rate")),
    }


def _float(value: object) -> float:
    return np.nan if value is None else float(value)


def run_dirs(sweep_dir: Path) -> list[Path]:
    """Run folders of a sweep, raising ValueError when there are none."""
    runs = Path(sweep_dir) / "runs"
    found = sorted(p for p in runs.iterdir() if p.is_dir() and visible(p)) if runs.is_dir() else []
    if not found:
        raise ValueError(
            f"no runs in sweep folder {sweep_dir} (expected {runs}/<run_id>/spec.json)"
        )
    return found


def load_sweep_runs(sweep_dir: Path) -> pd.DataFrame:
    """One tidy row per run folder of a sweep (finished or not)."""
    frame = pd.DataFrame([_sweep_run_row(d) for d in run_dirs(sweep_dir)])
    return _finish(frame)


def metric_files(sweep_dir: Path) -> list[Path]:
    """All visible metrics Parquet parts of a sweep."""
    parts = Path(sweep_dir).glob("runs/*/metrics/*.parquet")
    return sorted(p for p in parts if visible(p) and visible(p.parent.parent))


def load_metrics(
    sweep_dir: Path, names: Sequence[str] | None = None, run_ids: Sequence[str] | None = None
) -> pd.DataFrame:
    """Step metrics of a sweep as one long frame (run_id and name categorical).

    ``names``/``run_ids`` filter at scan time so large sweeps load only what is needed.
    Returns an empty frame with the metric columns when the sweep has no metrics yet.
    """
    files = metric_files(sweep_dir)
    if not files:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in METRIC_COLUMNS})
    # An explicit schema lets parts written with a plain-string ``name`` load alongside the rest.
    dataset = ds.dataset([str(f) for f in files], format="parquet", schema=metrics_schema())
    condition = None
    for column, allowed in (("name", names), ("run_id", run_ids)):
        if allowed is not None:
            term = pc.field(column).cast(pa.string()).isin(list(allowed))
            condition = term if condition is None else condition & term
    table = dataset.to_table(filter=condition)
    # Categorical run_id keeps 10 M rows from becoming 10 M Python strings.
    return table.to_pandas(strings_to_categorical=True, self_destruct=True)
