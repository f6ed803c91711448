"""`sweep export`: runs written to TensorBoard / W&B offline / MLflow and read back with each
tracker's own reader; idempotent; a changed run replaced, not duplicated."""

import importlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from analysis.synthetic import write_synthetic_sweep
from sweep.export import ExportError, export


def need(module: str) -> None:
    """Skip without the tracking extra locally; in CI (which installs it) fail instead."""
    try:
        importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip(
            f"needs the tracking extra: pip install -e '.[tracking]' ({module})",
            allow_module_level=True,
        )


need("tensorboard")


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    write_synthetic_sweep(
        root,
        configs={"bf16_bf16": 1.0, "fp8_e4m3_fp8_e4m3": 0.6},
        budgets=[1e12],
        shapes=[(32, 1), (64, 1)],
        n_points=30,
    )
    pending = root / "runs" / "pending-run"
    pending.mkdir()
    (pending / "spec.json").write_text(json.dumps({"seed": 0}))
    return root


def truth(sweep_dir: Path, run_id: str) -> dict[str, dict[int, float]]:
    """The run's metrics straight from its Parquet parts: name -> {step: value}."""
    table = pq.read_table(sweep_dir / "runs" / run_id / "metrics").to_pandas()
    return {
        str(name): dict(zip(g["step"].astype(int), g["value"].astype(float), strict=True))
        for name, g in table.groupby("name", observed=True)
    }


def summary_of(sweep_dir: Path, run_id: str) -> dict:
    return json.loads((sweep_dir / "runs" / run_id / "summary.json").read_text())


def files_under(path: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in path.rglob("*") if p.is_file()}


# --- readers: each tracker's own ----------------------------------------------------------


def read_tensorboard(out: Path, run_id: str):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list((out / run_id).glob("events.out.tfevents.*"))
    assert len(events) == 1, events
    acc = EventAccumulator(str(out / run_id), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    metrics = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    config = json.loads(acc.Tensors("config")[0].tensor_proto.string_val[0])
    summary = json.loads(acc.Tensors("summary")[0].tensor_proto.string_val[0])
    return metrics, config, summary


def read_mlflow(out: Path, run_id: str):
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=out.resolve().as_uri())
    experiments = client.search_experiments()
    found = client.search_runs(
        [e.experiment_id for e in experiments], f"tags.`mxscale.run_id` = '{run_id}'"
    )
    assert len(found) == 1, found
    run = found[0]
    metrics = {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        for key in run.data.metrics
        if not key.startswith("summary/")
    }
    summary = {
        k[len("summary.") :]: v for k, v in run.data.tags.items() if k.startswith("summary.")
    }
    assert run.info.run_name == run_id and run.info.status == "FINISHED"
    return metrics, dict(run.data.params), summary


def _leveldb_records(path: Path):
    """Records of a W&B transaction log (LevelDB log framing: 32 KiB blocks, 7-byte record
    headers, FULL/FIRST/MIDDLE/LAST chunks) after its 7-byte ':W&B' file header."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # FULL or LAST
            yield pending
            pending = b""


def read_wandb(out: Path, run_id: str):
    from wandb.proto import wandb_internal_pb2

    dirs = sorted((out / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(dirs) == 1, dirs
    metrics: dict[str, dict[int, float]] = {}
    config: dict[str, object] = {}
    summary: dict[str, object] = {}
    for raw in _leveldb_records(dirs[0] / f"run-{run_id}.wandb"):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            assert record.run.run_id == run_id and record.run.display_name == run_id
        if kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            step = int(items.pop("_step"))
            for key, value in items.items():
                if not key.startswith("_"):
                    metrics.setdefault(key, {})[step] = value
        elif kind in ("config", "run"):
            # The config comes with the run record (and in config records when it changes).
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates})
        elif kind == "summary":
            for item in record.summary.update:
                key = item.key or "/".join(item.nested_key)
                if key.startswith("summary/"):
                    summary[key[len("summary/") :]] = json.loads(item.value_json)
    return metrics, config, summary


READERS = {"tensorboard": read_tensorboard, "mlflow": read_mlflow, "wandb": read_wandb}


@pytest.mark.parametrize("tracker", ["tensorboard", "mlflow", "wandb"])
def test_export_reads_back_and_is_idempotent(sweep_dir, tmp_path, tracker):
    need(tracker)
    out = tmp_path / tracker
    first = export(sweep_dir, tracker, out)
    run_ids = sorted(p.name for p in (sweep_dir / "runs").iterdir() if p.name != "pending-run")
    assert sorted(first.written) == run_ids and first.no_metrics == ["pending-run"]
    for run_id in run_ids:
        metrics, config, summary = READERS[tracker](out, run_id)
        expected = truth(sweep_dir, run_id)
        assert set(metrics) == set(expected)
        for name, series in expected.items():
            assert sorted(metrics[name]) == sorted(series)
            got = np.array([metrics[name][s] for s in sorted(series)], float)
            want = np.array([series[s] for s in sorted(series)], float)
            # TensorBoard stores scalars as float32.
            np.testing.assert_allclose(got, want, rtol=1e-6 if tracker == "tensorboard" else 0)
        spec = json.loads((sweep_dir / "runs" / run_id / "spec.json").read_text())
        assert str(config["model.d_model"]) == str(spec["model"]["d_model"])
        assert str(config["precision.w_fmt"]) == spec["precision"]["w_fmt"]
        assert config["precision_label"] == summary_of(sweep_dir, run_id)["config"]
        assert float(summary["final_val_loss"]) == summary_of(sweep_dir, run_id)["final_val_loss"]

    before = files_under(out)
    again = export(sweep_dir, tracker, out)
    assert again.written == [] and sorted(again.unchanged) == run_ids
    assert files_under(out) == before  # nothing new, nothing touched

    # A run that changed (e.g. trained further) replaces its export; still one per run id.
    changed = run_ids[0]
    path = sweep_dir / "runs" / changed / "summary.json"
    original = path.read_text()
    try:
        path.write_text(json.dumps({**json.loads(original), "final_val_loss": 9.5}))
        third = export(sweep_dir, tracker, out, runs=[changed[:20]])
        assert third.written == [changed]
        _, _, summary = READERS[tracker](out, changed)
        assert float(summary["final_val_loss"]) == 9.5
    finally:
        path.write_text(original)


def test_bad_input_is_an_export_error(sweep_dir, tmp_path):
    with pytest.raises(ExportError, match="allowed: tensorboard, wandb, mlflow"):
        export(sweep_dir, "neptune", tmp_path)
    with pytest.raises(ExportError, match="matches 0 runs"):
        export(sweep_dir, "tensorboard", tmp_path, runs=["nope"])
    with pytest.raises(ExportError, match="not a sweep folder"):
        export(tmp_path, "tensorboard", tmp_path / "out")


def test_cli_without_the_tracker_says_what_to_install(sweep_dir, tmp_path, repo_root):
    # The package made unimportable, as on an install without the tracking extra.
    code = (
        "import sys; sys.modules['wandb'] = None; from sweep.cli import main; "
        f"sys.argv = ['sweep', 'export', {str(sweep_dir)!r}, '--to', 'wandb', "
        f"'--out', {str(tmp_path / 'w')!r}]; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert "pip install" in result.stderr and "tracking" in result.stderr
    assert not (tmp_path / "w").exists()
    ok = subprocess.run(
        [sys.executable, "-m", "sweep.cli", "export", str(sweep_dir), "--to", "tensorboard"]
        + ["--out", str(tmp_path / "tb")],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert "wrote 4 run(s), 0 unchanged, 1 without metrics yet" in ok.stdout
