"""``sweep export``: every run of a sweep as one experiment-tracker run, offline by default.

Each run becomes one tracker run keyed by its run id, carrying its Parquet step metrics (one
scalar series per metric name), its config (flattened spec fields plus the precision label)
and its summary. Exporting is idempotent: a manifest in the output folder records each run's
fingerprint (its spec, summary and metric parts), so a second export of unchanged runs
writes nothing, and a run that changed since (it trained further) is replaced, not
duplicated. Backends: TensorBoard event files, W&B offline run folders (``wandb sync``
uploads them) and a local MLflow file store. The trackers are optional (``pip install
.[tracking]``); torch is not needed.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.load import load_metrics, metric_files
from runfolder.atomic import read_json
from runfolder.paths import RunPaths

TRACKERS = ("tensorboard", "wandb", "mlflow")
# The import each backend needs, and what to install when it is missing.
MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
MANIFEST = "mxscale-export.json"


class ExportError(ValueError):
    """Bad tracker name, missing tracker package or unknown run (the CLI exits 2)."""


@dataclass
class RunExport:
    """What one run contributes: its id, flat config, summary and long step metrics."""

    run_id: str
    config: dict[str, object]
    summary: dict[str, object]
    metrics: pd.DataFrame  # columns step, name, value, wall_time
    fingerprint: str

    def series(self) -> Iterator[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
        """(name, steps, values, wall times) per metric, sorted by step."""
        for name, group in self.metrics.groupby("name", observed=True, sort=True):
            group = group.sort_values("step")
            yield (
                str(name),
                group["step"].to_numpy(np.int64),
                group["value"].to_numpy(float),
                group["wall_time"].to_numpy(float),
            )


@dataclass
class ExportResult:
    """Run ids written, skipped because already exported, and left out (no metrics)."""

    out_dir: Path
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    no_metrics: list[str] = field(default_factory=list)


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """``{"model": {"d_model": 64}}`` -> ``{"model.d_model": 64}`` (lists become JSON text)."""
    flat: dict[str, object] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            flat[name] = json.dumps(value)
        else:
            flat[name] = value
    return flat


def _fingerprint(run_dir: Path, parts: list[Path]) -> str:
    digest = hashlib.sha256()
    paths = RunPaths(run_dir)
    for path in [paths.spec, paths.summary, *parts]:
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def load_run(sweep_dir: Path, run_id: str) -> RunExport | None:
    """One run's export payload, or None when it has no metrics yet."""
    run_dir = Path(sweep_dir) / "runs" / run_id
    parts = [p for p in metric_files(sweep_dir) if p.parent.parent == run_dir]
    if not parts:
        return None
    metrics = load_metrics(sweep_dir, run_ids=[run_id])
    paths = RunPaths(run_dir)
    spec = read_json(paths.spec) or {}
    summary = read_json(paths.summary) or {}
    label = summary.get("config") or (spec.get("tags") or {}).get("config")
    config = {**flatten(spec), "run_id": run_id, "precision_label": label}
    return RunExport(run_id, config, summary, metrics, _fingerprint(run_dir, parts))


def select_runs(sweep_dir: Path, wanted: Sequence[str] | None) -> list[str]:
    """All run ids of a sweep, or those matching each of ``wanted`` (a unique prefix)."""
    runs_dir = Path(sweep_dir) / "runs"
    if not runs_dir.is_dir():
        raise ExportError(f"{sweep_dir}: not a sweep folder (no runs/ inside)")
    ids = sorted(p.name for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not wanted:
        return ids
    chosen = []
    for prefix in wanted:
        matches = [rid for rid in ids if rid.startswith(prefix)]
        if len(matches) != 1:
            raise ExportError(f"--runs {prefix!r} matches {len(matches)} runs of {sweep_dir}")
        chosen.append(matches[0])
    return list(dict.fromkeys(chosen))


def require(tracker: str) -> None:
    """Raise ExportError naming what to install when the tracker's package is missing."""
    if tracker not in TRACKERS:
        raise ExportError(f"unknown tracker {tracker!r}; allowed: {', '.join(TRACKERS)}")
    try:
        importlib.import_module(MODULES[tracker])
    except ImportError:
        raise ExportError(
            f"--to {tracker} needs the {MODULES[tracker]!r} package: "
            "pip install 'mxscale[tracking]' (or pip install -e '.[tracking]' in a checkout)"
        ) from None


# --- TensorBoard ---------------------------------------------------------------------------


def _tb_write(run: RunExport, out: Path) -> None:
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.plugins.hparams import summary_v2 as hparams
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    run_dir = out / run.run_id
    writer = EventFileWriter(str(run_dir))

    def text(tag: str, body: str) -> None:
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[body.encode()])
        meta = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
        )
        value = summary_pb2.Summary.Value(tag=tag, tensor=tensor, metadata=meta)
        writer.add_event(event_pb2.Event(step=0, summary=summary_pb2.Summary(value=[value])))

    for name, steps, values, walls in run.series():
        for step, value, wall in zip(steps, values, walls, strict=True):
            value_pb = summary_pb2.Summary.Value(tag=name, simple_value=float(value))
            event = event_pb2.Event(
                wall_time=float(wall), step=int(step), summary=summary_pb2.Summary(value=[value_pb])
            )
            writer.add_event(event)
    text("config", json.dumps(run.config, sort_keys=True, default=str))
    text("summary", json.dumps(run.summary, sort_keys=True, default=str))
    params = {k: v for k, v in run.config.items() if isinstance(v, bool | int | float | str)}
    writer.add_event(event_pb2.Event(summary=hparams.hparams_pb(params, start_time_secs=0)))
    writer.flush()
    writer.close()


def _tb_remove(run_id: str, out: Path) -> None:
    shutil.rmtree(out / run_id, ignore_errors=True)


def _tb_exists(run_id: str, out: Path) -> bool:
    return any((out / run_id).glob("events.out.tfevents.*"))


# --- MLflow --------------------------------------------------------------------------------


def _mlflow_client(out: Path):
    from mlflow.tracking import MlflowClient

    # MLflow 3 keeps the file store (what `mlflow ui --backend-store-uri DIR` reads) behind
    # this opt-in; it is the one local store mlflow-skinny can write without a database.
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return MlflowClient(
        tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or out.resolve().as_uri()
    )


def _mlflow_experiment(client, name: str) -> str:
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found else client.create_experiment(name)


def _mlflow_find(client, experiment: str, run_id: str) -> list:
    return client.search_runs([experiment], filter_string=f"tags.`mxscale.run_id` = '{run_id}'")


def _mlflow_write(run: RunExport, out: Path, experiment_name: str) -> None:
    from mlflow.entities import Metric, Param, RunTag

    client = _mlflow_client(out)
    experiment = _mlflow_experiment(client, experiment_name)
    tags = {"mxscale.run_id": run.run_id, "mlflow.runName": run.run_id}
    created = client.create_run(experiment, run_name=run.run_id, tags=tags)
    rid = created.info.run_id
    params = [Param(k, str(v)[:6000]) for k, v in sorted(run.config.items())]
    summary = [RunTag(f"summary.{k}", str(v)[:5000]) for k, v in sorted(run.summary.items())]
    metrics = [
        Metric(name, float(value), int(wall * 1000), int(step))
        for name, steps, values, walls in run.series()
        for step, value, wall in zip(steps, values, walls, strict=True)
    ]
    metrics += [
        Metric(f"summary/{k}", float(v), 0, 0)
        for k, v in sorted(run.summary.items())
        if isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v)
    ]
    # The store caps a batch at 1000 metrics and 100 params/tags.
    for i in range(0, len(params), 100):
        client.log_batch(rid, params=params[i : i + 100])
    for i in range(0, len(summary), 100):
        client.log_batch(rid, tags=summary[i : i + 100])
    for i in range(0, len(metrics), 1000):
        client.log_batch(rid, metrics=metrics[i : i + 1000])
    client.set_terminated(rid)


def _mlflow_remove(run_id: str, out: Path, experiment_name: str) -> None:
    client = _mlflow_client(out)
    for found in _mlflow_find(client, _mlflow_experiment(client, experiment_name), run_id):
        client.delete_run(found.info.run_id)


def _mlflow_exists(run_id: str, out: Path, experiment_name: str) -> bool:
    client = _mlflow_client(out)
    found = client.get_experiment_by_name(experiment_name)
    return bool(found and _mlflow_find(client, found.experiment_id, run_id))


# --- Weights & Biases ----------------------------------------------------------------------


def _wandb_dirs(run_id: str, out: Path) -> list[Path]:
    return sorted((out / "wandb").glob(f"*-run-*-{run_id}"))


def _wandb_write(run: RunExport, out: Path, project: str) -> None:
    import wandb

    steps: dict[int, dict[str, float]] = {}
    for name, run_steps, values, _ in run.series():
        for step, value in zip(run_steps, values, strict=True):
            steps.setdefault(int(step), {})[name] = float(value)
    settings = wandb.Settings(
        mode=os.environ.get("WANDB_MODE", "offline"),
        console="off",
        save_code=False,
        disable_git=True,
        x_disable_stats=True,
        silent=True,
    )
    tracked = wandb.init(
        dir=str(out),
        project=project,
        id=run.run_id,
        name=run.run_id,
        config=run.config,
        settings=settings,
        reinit="create_new",
    )
    for step in sorted(steps):
        tracked.log(steps[step], step=step)
    tracked.summary.update({f"summary/{k}": v for k, v in run.summary.items() if v is not None})
    tracked.finish()


def _wandb_remove(run_id: str, out: Path) -> None:
    for path in _wandb_dirs(run_id, out):
        shutil.rmtree(path, ignore_errors=True)


def _wandb_exists(run_id: str, out: Path) -> bool:
    return bool(_wandb_dirs(run_id, out))


@dataclass(frozen=True)
class Backend:
    write: Callable[[RunExport], None]
    remove: Callable[[str], None]
    exists: Callable[[str], bool]


def _backend(tracker: str, out: Path, name: str) -> Backend:
    if tracker == "tensorboard":
        return Backend(
            lambda r: _tb_write(r, out), lambda i: _tb_remove(i, out), lambda i: _tb_exists(i, out)
        )
    if tracker == "mlflow":
        return Backend(
            lambda r: _mlflow_write(r, out, name),
            lambda i: _mlflow_remove(i, out, name),
            lambda i: _mlflow_exists(i, out, name),
        )
    return Backend(
        lambda r: _wandb_write(r, out, name),
        lambda i: _wandb_remove(i, out),
        lambda i: _wandb_exists(i, out),
    )


def export(
    sweep_dir: Path,
    tracker: str,
    out_dir: Path | None = None,
    runs: Sequence[str] | None = None,
    on_run: Callable[[str, str], None] | None = None,
) -> ExportResult:
    """Export the sweep's runs (or those named) to ``tracker`` under ``out_dir`` (default
    ``SWEEP_DIR/export/<tracker>``); ``on_run(run_id, what)`` hears of each run."""
    require(tracker)
    sweep_dir = Path(sweep_dir)
    run_ids = select_runs(sweep_dir, runs)
    out = Path(out_dir) if out_dir else sweep_dir / "export" / tracker
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    manifest = read_json(manifest_path) or {}
    name = (read_json(sweep_dir / "sweep.json") or {}).get("name") or sweep_dir.resolve().name
    backend = _backend(tracker, out, name)
    result = ExportResult(out)
    for run_id in run_ids:
        run = load_run(sweep_dir, run_id)
        if run is None:
            result.no_metrics.append(run_id)
            continue
        if manifest.get(run_id) == run.fingerprint and backend.exists(run_id):
            result.unchanged.append(run_id)
            continue
        backend.remove(run_id)  # a changed run replaces its old export
        backend.write(run)
        manifest[run_id] = run.fingerprint
        # Written after each run: an interrupted export keeps what it finished.
        tmp = manifest_path.with_name(f".{MANIFEST}.tmp")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        tmp.replace(manifest_path)
        result.written.append(run_id)
        if on_run:
            on_run(run_id, "written")
    return result
