"""The run-folder contract (runfolder/): names, the tolerant reader, cancel records, labels,
and that it imports neither torch nor pydantic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from runfolder.atomic import atomic_write_json, read_json
from runfolder.label import config_label, precision_label
from runfolder.paths import RunPaths, attempt_logs, log_name
from runfolder.records import (
    Submission,
    effective_marker,
    read_submitted,
    write_cancel,
    write_submitted,
)


def test_runfolder_imports_only_the_standard_library():
    code = (
        "import sys, runfolder, runfolder.records, runfolder.metrics; "
        "bad = [m for m in ('torch', 'pydantic', 'pyarrow', 'models', 'sweep', 'mx') "
        "if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_log_names_are_one_scheme_for_every_executor(tmp_path):
    assert log_name(3) == "attempt-3.log"
    assert log_name(2, "err", rank=1) == "attempt-2.rank1.err"
    assert RunPaths(tmp_path).log(1, "out") == tmp_path / "logs" / "attempt-1.out"
    with pytest.raises(ValueError, match="allowed: log, out, err"):
        log_name(1, "stdout")
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("attempt-10.log", "attempt-2.out", "attempt-2.rank1.out", "attempt-1.log"):
        (logs / name).write_text("")
    assert [p.name for p in attempt_logs(logs)] == [
        "attempt-1.log",
        "attempt-2.out",
        "attempt-10.log",
        "attempt-2.rank1.out",
    ]
    assert [p.name for p in attempt_logs(logs, 2)] == ["attempt-2.out", "attempt-2.rank1.out"]


@pytest.mark.parametrize("text", ["", '{"state": "runn', "[1, 2]", "\xff"])
def test_the_reader_takes_a_damaged_file_for_absent(tmp_path, text):
    path = tmp_path / "state.json"
    path.write_bytes(text.encode("latin-1"))
    assert read_json(path) is None
    assert read_json(tmp_path / "missing.json") is None
    atomic_write_json(path, {"state": "done"})
    assert read_json(path) == {"state": "done"}


def test_a_submission_without_executor_or_attempt_reads_as_never_written(tmp_path):
    write_submitted(tmp_path, Submission("r", "slurm", "12_0", 2, token="t"))
    record = read_submitted(tmp_path)
    assert record["job_id"] == "12_0" and record["attempt"] == 2 and "host" in record
    (tmp_path / "submitted.json").write_text(json.dumps({"executor": "slurm", "attempt": "2"}))
    assert read_submitted(tmp_path) is None


def test_a_cancel_covers_its_attempt_only_and_never_a_finished_run(tmp_path):
    write_cancel(tmp_path, 2, "cancelled by `sweep cancel`")
    cancel = read_json(tmp_path / "cancel.json")
    running = {"state": "running", "step": 7, "attempt": 2}
    assert effective_marker(running, {"attempt": 2}, cancel) == {
        "state": "cancelled",
        "step": 7,
        "attempt": 2,
        "reason": "cancelled by `sweep cancel`",
    }
    # Queued, never started: the request alone makes the run cancelled.
    assert effective_marker(None, {"attempt": 2}, cancel)["state"] == "cancelled"
    # A later resubmission outlives the request; a finished run stays finished.
    assert effective_marker(running, {"attempt": 3}, cancel) == running
    done = {"state": "done", "step": 9, "attempt": 2}
    assert effective_marker(done, {"attempt": 2}, cancel) == done
    own = {"state": "cancelled", "step": 5, "attempt": 2, "reason": "its own"}
    assert effective_marker(own, {"attempt": 2}, cancel) == own
    assert effective_marker(running, {"attempt": 2}, None) == running


def test_labels_from_a_spec_mapping():
    assert precision_label({}) == "fp32_fp32"
    assert precision_label({"w_fmt": "fp8_e4m3", "a_fmt": "bf16", "quantize_backward": False}) == (
        "fp8_e4m3_bf16_quantize_only_fwd"
    )
    assert precision_label({"w_fmt": "nvfp4", "a_fmt": "bf16", "nvfp4_weight_block": "1x16"}) == (
        "nvfp4_bf16_w1x16"
    )
    spec = {"precision": {"w_fmt": "bf16", "a_fmt": "bf16"}, "tags": {"config": "mine"}}
    assert config_label(spec) == "mine"
    assert config_label({**spec, "tags": {}}) == "bf16_bf16"


def test_run_spec_resolve_fills_steps_and_label_once():
    from models.config import LMConfig, RunSpec, TrainConfig

    spec = RunSpec(model=LMConfig(d_model=64, seq_len=16), train=TrainConfig(steps=1))
    resolved = spec.resolve(steps=40)
    assert resolved.train.steps == 40 and resolved.tags == {"config": "fp32_fp32"}
    assert resolved.tokens == 40 * 512 * 16
    assert resolved.flops == 6.0 * spec.model.param_count() * resolved.tokens
    assert resolved.n_params == spec.model.param_count()
    assert spec.train.steps == 1 and spec.tags == {}  # the spec itself is unchanged


def test_a_results_only_summary_loads_like_an_old_one(tmp_path: Path):
    from analysis.load import load_sweep_runs
    from runfolder.records import SUMMARY_FROM_SPEC

    spec = {
        "model": {"kind": "lm", "d_model": 64, "n_layers": 1},
        "precision": {"w_fmt": "bf16", "a_fmt": "bf16"},
        "train": {"steps": 10, "lr": 1e-3},
        "seed": 3,
        "budget": 1e12,
        "tags": {"config": "mine"},
    }
    results = {"run_id": "r", "config": "mine", "state": "done", "steps_done": 10,
               "final_val_loss": 2.5, "min_val_loss": 2.4, "n_params": 1000, "tokens": 5000,
               "flops": 3e7}  # fmt: skip
    copied = {"w_fmt": "bf16", "a_fmt": "bf16", "d_model": 64, "n_layers": 1, "lr": 1e-3,
              "seed": 3, "budget": 1e12, "parent": None, "branch_step": None,
              "arm": None}  # fmt: skip
    assert set(copied) == set(SUMMARY_FROM_SPEC)
    frames = []
    for name, summary in (("old", {**results, **copied}), ("new", results)):
        run_dir = tmp_path / name / "runs" / "r"
        run_dir.mkdir(parents=True)
        (run_dir / "spec.json").write_text(json.dumps(spec))
        (run_dir / "summary.json").write_text(json.dumps(summary))
        frames.append(load_sweep_runs(tmp_path / name))
    pd.testing.assert_frame_equal(frames[0], frames[1])
    row = frames[1].iloc[0]
    assert (row["config"], row["seed"], row["budget"], row["d_model"]) == ("mine", 3, 1e12, 64)


def test_a_real_run_writes_a_results_only_summary(tmp_path: Path):
    from analysis.load import load_sweep_runs
    from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
    from mx.spec import PrecisionSpec
    from runfolder.records import SUMMARY_FROM_SPEC
    from sweep.run import execute

    spec = RunSpec(
        model=LMConfig(d_model=32, n_layers=1, head_dim=16, vocab_size=64, seq_len=16),
        data=SyntheticData(order=1, branching=4),
        train=TrainConfig(steps=4, batch_size=4, lr=3e-3, eval_every=4, checkpoint_every=4),
        precision=PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3"),
        seed=7,
        budget=1e9,
    )
    run_dir = tmp_path / "sweep" / "runs" / spec.run_id
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(spec.model_dump_json())
    assert execute(run_dir) == 0
    summary = read_json(RunPaths(run_dir).summary)
    assert summary["state"] == "done" and summary["steps_done"] == 4
    assert summary["config"] == "fp8_e4m3_fp8_e4m3" and summary["final_val_loss"] > 0
    assert not set(summary) & set(SUMMARY_FROM_SPEC)
    row = load_sweep_runs(tmp_path / "sweep").iloc[0]
    assert (row["w_fmt"], row["seed"], row["budget"], row["d_model"]) == ("fp8_e4m3", 7, 1e9, 32)
