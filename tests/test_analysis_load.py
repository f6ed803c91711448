"""Loaders: sweep folders and the paper's table give the same tidy frame; no torch import."""

import json
import subprocess
import sys

import numpy as np
import pytest

from analysis.configs import parse_config
from analysis.load import RUN_COLUMNS, load_metrics, load_paper_runs, load_sweep_runs
from analysis.synthetic import write_synthetic_sweep


@pytest.fixture
def sweep(tmp_path):
    write_synthetic_sweep(
        tmp_path,
        configs={"bf16_bf16": 1.0, "fp8_e4m3_fp8_e4m3": 0.7},
        budgets=[1e12, 1e13],
        shapes=[(32, 1), (64, 1)],
        n_points=40,
    )
    return tmp_path


def test_sweep_frame_has_tidy_columns(sweep):
    runs = load_sweep_runs(sweep)
    assert list(runs.columns[: len(RUN_COLUMNS)]) == list(RUN_COLUMNS)
    assert len(runs) == 8 and set(runs["source"]) == {"sweep"}
    assert set(runs["w_fmt"]) == {"bf16", "fp8_e4m3"} and set(runs["variant"]) == {""}
    np.testing.assert_allclose(runs["ratio"], runs["tokens"] / runs["n_params"])


def test_unfinished_runs_and_temp_files(sweep):
    pending = sweep / "runs" / "abc123"
    pending.mkdir()
    precision = {"w_fmt": "fp8_e5m2", "a_fmt": "bf16", "quantize_backward": False}
    (pending / "spec.json").write_text(
        json.dumps({"model": {"d_model": 64}, "precision": precision, "seed": 1, "budget": 1e12})
    )
    (pending / "state.json").write_text(json.dumps({"state": "running", "step": 3}))
    (pending / "metrics").mkdir()
    (pending / "metrics" / ".part-00000.parquet.tmp").write_bytes(b"half-written")
    row = load_sweep_runs(sweep).set_index("run_id").loc["abc123"]
    assert row["state"] == "running" and row["config"] == "fp8_e5m2_bf16_quantize_only_fwd"
    assert np.isnan(row["final_val_loss"]) and row["budget"] == 1e12
    assert len(load_metrics(sweep)) == 8 * 40 * 2  # the temp part is ignored


def test_metrics_filter_by_name_and_run(sweep):
    runs = load_sweep_runs(sweep)
    one = runs["run_id"].iloc[0]
    metrics = load_metrics(sweep, names=["train/loss"], run_ids=[one])
    assert set(metrics["name"]) == {"train/loss"} and set(metrics["run_id"]) == {one}
    assert len(metrics) == 40 and metrics["step"].is_monotonic_increasing


def test_empty_or_missing_sweep_raises(tmp_path):
    with pytest.raises(ValueError, match="no runs"):
        load_sweep_runs(tmp_path)


def test_paper_frame_matches_published_table():
    runs = load_paper_runs()
    assert len(runs) == 1154 and runs["config"].nunique() == 16
    assert list(runs.columns[: len(RUN_COLUMNS)]) == list(RUN_COLUMNS)
    # The paper's "bfloat16" activations become this project's "bf16".
    assert "fp8_e5m2_bf16" in set(runs["config"]) and "bfloat16" not in set(runs["a_fmt"])
    assert runs["budget"].nunique() == 8
    np.testing.assert_allclose(runs["flops"], runs["budget"], rtol=0.01)
    d512 = runs[(runs["d_model"] == 512) & (runs["n_layers"] == 8)]
    assert set(d512["n_params"]) == {57_950_720}  # N = 12Ld^2 + 2Vd + (4L+1)d


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("fp8_e5m2_bfloat16", ("fp8_e5m2", "bf16", "")),
        ("fp8_e5m2_fp8_e5m2_block_size_2", ("fp8_e5m2", "fp8_e5m2", "block_size_2")),
        ("bf16_bf16", ("bf16", "bf16", "")),
    ],
)
def test_parse_config(name, parsed):
    assert tuple(parse_config(name)) == parsed


def test_parse_config_rejects_unknown_format():
    with pytest.raises(ValueError, match="allowed"):
        parse_config("fp9_e9m9_bf16")


def test_analysis_never_imports_torch():
    code = (
        "import sys, analysis.report, analysis.synthetic, analysis.fit; "
        "bad = [m for m in ('torch', 'mx', 'models', 'sweep') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_parts_with_plain_string_names_load_together(sweep):
    import pyarrow as pa
    import pyarrow.parquet as pq

    run = sorted((sweep / "runs").iterdir())[0]
    plain = pa.table(
        {
            "run_id": [run.name] * 2,
            "step": [1000, 1010],
            "tokens": [1, 2],
            "flops": [1.0, 2.0],
            "name": ["perf/step_time"] * 2,
            "value": [0.1, 0.2],
            "wall_time": [1.0, 2.0],
        }
    )
    pq.write_table(plain, run / "metrics" / "part-00001.parquet")
    metrics = load_metrics(sweep, names=["perf/step_time"])
    assert len(metrics) == 2 and metrics["value"].tolist() == [0.1, 0.2]


def test_metrics_schema_matches_the_writer(tmp_path):
    import pyarrow.parquet as pq

    from models.metrics import MetricsWriter
    from runfolder.metrics import metrics_schema

    writer = MetricsWriter(tmp_path, "run")
    writer.log(1, 10, 1.0, {"train/loss": 2.0})
    assert pq.read_schema(writer.flush()).equals(metrics_schema())
