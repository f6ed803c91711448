"""Cost and ETA in `sweep status` from measured throughput; provenance per run."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.config import RunSpec
from sweep.cost import ASSUMED_CORE_FLOPS, n_params
from sweep.provenance import CODE_ROOT, PROVENANCE_FILE, write_provenance
from sweep.store import SweepStore

STEPS = 100


def _spec(config: str, d_model: int, seed: int) -> RunSpec:
    return RunSpec.model_validate(
        {
            "model": {"d_model": d_model, "head_dim": 32, "vocab_size": 64, "seq_len": 16},
            "train": {"steps": STEPS, "batch_size": 4},
            "resources": {"cpus": 2},
            "seed": seed,
            "tags": {"config": config},
        }
    )


@pytest.fixture
def sweep(tmp_path: Path):
    """Config a (d_model 32): done at 1,000 tok/s, running at 640 tok/s, pending.
    Config b (d_model 64): pending, never measured."""
    now = time.time()
    specs = [_spec("a", 32, 0), _spec("a", 32, 1), _spec("a", 32, 2), _spec("b", 64, 0)]
    store = SweepStore(tmp_path / "sweep")
    store.initialise("name: t\n", [s.run_id for s in specs], update_grid=False)
    dirs = [store.write_spec(s.run_id, s.model_dump_json()) for s in specs]
    (dirs[0] / "state.json").write_text(json.dumps({"state": "done", "step": STEPS}))
    (dirs[0] / "summary.json").write_text(
        json.dumps({"steps_done": STEPS, "wall_time_s": 6.4, "tokens_per_s": 1000.0})
    )
    # 40 steps x 64 tokens in 4 s: 640 tokens/s.
    marker = {
        "state": "running",
        "step": 50,
        "attempt": 1,
        "heartbeat": now,
        "started_at": now - 30,
        "first_step": 10,
        "first_step_at": now - 4.0,
    }
    (dirs[1] / "state.json").write_text(json.dumps(marker))
    return store, specs, dirs


def _status(*args):
    result = subprocess.run(
        [sys.executable, "-m", "sweep", "status", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_remaining_core_hours_and_eta_from_measured_rates(sweep):
    store, specs, _ = sweep
    report = json.loads(_status(str(store.root), "--json"))
    n_a, n_b = (spec.model.param_count() for spec in (specs[0], specs[3]))
    assert n_params(json.loads(specs[0].model_dump_json())) == n_a
    tokens = 4 * 16
    rate_done, rate_running = 6 * n_a * 1000.0 / 2, 6 * n_a * 640.0 / 2  # FLOP/s per core
    # Running run: its own rate, 50 steps left.  Pending a: median of both a-runs.
    left_running = 6 * n_a * 50 * tokens / (rate_running * 2)
    left_pending_a = 6 * n_a * STEPS * tokens / ((rate_done + rate_running) / 2 * 2)
    left_b = 6 * n_b * STEPS * tokens / ((rate_done + rate_running) / 2 * 2)
    a, b, total = (
        report["cost"]["configs"]["a"],
        report["cost"]["configs"]["b"],
        report["cost"]["total"],
    )
    assert a["remaining_core_hours"] == pytest.approx((left_running + left_pending_a) * 2 / 3600)
    assert a["estimated_from"] == {"measured": 1, "similar runs": 1}
    assert b["estimated_from"] == {"any run": 1}
    assert b["remaining_core_hours"] == pytest.approx(left_b * 2 / 3600)
    assert b["eta_s"] is None  # nothing of b is running
    # One run slot busy: the remaining work is done one run after the other.
    assert total["eta_s"] == pytest.approx(left_running + left_pending_a + left_b)
    assert a["elapsed_core_hours"] == pytest.approx((6.4 + 30) * 2 / 3600, rel=0.05)
    assert (total["finished"], total["running"], total["runs"]) == (1, 1, 4)
    text = _status(str(store.root), "--no-runs")
    assert "cost and ETA" in text and "1 measured, 1 similar runs" in text


def test_before_any_run_the_plan_rate_is_assumed(tmp_path):
    spec = _spec("a", 32, 0)
    store = SweepStore(tmp_path / "sweep")
    store.initialise("name: t\n", [spec.run_id], update_grid=False)
    store.write_spec(spec.run_id, spec.model_dump_json())
    total = json.loads(_status(str(store.root), "--json"))["cost"]["total"]
    flops = 6 * spec.model.param_count() * STEPS * 64
    assert total["estimated_from"] == {"assumed": 1}
    assert total["remaining_core_hours"] == pytest.approx(flops / ASSUMED_CORE_FLOPS / 3600)


def test_provenance_names_commit_diff_packages_and_host(tmp_path):
    record = write_provenance(tmp_path, attempt=2)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=CODE_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    diff = subprocess.run(
        ["git", "diff", "HEAD", "--no-color"], cwd=CODE_ROOT, capture_output=True, text=True
    ).stdout
    saved = json.loads((tmp_path / PROVENANCE_FILE).read_text())
    assert saved["commit"] == record["commit"] == head and saved["attempt"] == 2
    assert saved["dirty"] == bool(diff)
    if diff:
        assert saved["diff_sha256"] == hashlib.sha256(diff.encode()).hexdigest()
        assert (tmp_path / saved["diff_file"]).read_text() == diff
    assert saved["packages"]["mxscale"] and saved["packages"]["pydantic"]
    assert saved["host"] and saved["accelerator"] and saved["command"]
    write_provenance(tmp_path, attempt=3)
    assert [
        a["attempt"] for a in json.loads((tmp_path / PROVENANCE_FILE).read_text())["attempts"]
    ] == [2, 3]


def test_status_exposes_commits_and_flags_a_mixed_sweep(sweep):
    store, specs, dirs = sweep
    for run_dir, commit in zip(dirs, ["c1" * 20, "c1" * 20, "c2" * 20, None], strict=True):
        (run_dir / PROVENANCE_FILE).write_text(json.dumps({"commit": commit}))
    report = json.loads(_status(str(store.root), "--json"))
    assert report["commits"] == {"c1" * 20: 2, "c2" * 20: 1}
    by_id = {row["run_id"]: row["commit"] for row in report["runs"]}
    assert [by_id[s.run_id] for s in specs] == ["c1" * 20, "c1" * 20, "c2" * 20, None]
    assert "note: runs from 2 commits: c1c1c1c1c1 (2 runs), c2c2c2c2c2 (1 runs)" in _status(
        str(store.root), "--no-runs"
    )


def test_plan_calibrated_from_a_previous_sweep(sweep, tmp_path):
    from typer.testing import CliRunner

    from sweep.cli import app

    store, specs, _ = sweep
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        "name: next\nbase: {model: {vocab_size: 64, seq_len: 16, head_dim: 32, d_model: 64},"
        " train: {batch_size: 4, steps: 1000}, resources: {cpus: 2}}\naxes: {seed: [0, 1]}\n"
    )
    runner = CliRunner()
    plain = json.loads(runner.invoke(app, ["plan", str(grid), "--json"]).output)["totals"]
    result = runner.invoke(app, ["plan", str(grid), "--json", "--calibrate-from", str(store.root)])
    assert result.exit_code == 0, result.output
    totals = json.loads(result.output)["totals"]
    n_a = specs[0].model.param_count()
    per_core = (6 * n_a * 1000.0 / 2 + 6 * n_a * 640.0 / 2) / 2
    assert totals["assumed_cpu_gflops"] == pytest.approx(per_core / 1e9)
    assert totals["cpu_core_hours"] == pytest.approx(totals["flops"] / per_core / 3600)
    assert totals["cpu_core_hours"] != pytest.approx(plain["cpu_core_hours"])
    assert totals["calibrated_from"] == {"sweep_dir": str(store.root), "gpu_runs": 0, "cpu_runs": 2}
    assert totals["assumed_gpu_tflops"] == 150.0  # no GPU run measured: still assumed
    empty = SweepStore(tmp_path / "empty")
    empty.initialise("name: t\n", [], update_grid=False)
    empty.runs_dir.mkdir()
    refused = runner.invoke(app, ["plan", str(grid), "--calibrate-from", str(empty.root)])
    assert refused.exit_code == 2 and "no run has measured throughput" in refused.output
