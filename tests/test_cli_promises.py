"""The README's command-line promises, each through the real CLI: plan, schema, --dry-run,
--executor auto without sbatch, cancel (and the cancelled state), logs, clean --failed,
exit code 2 for every class of bad input, atomic temp+rename writes, --paper."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analysis.configs import parse_config
from models.config import RunSpec
from models.transformer import TransformerLM

ROOT = Path(__file__).resolve().parents[1]
SWEEP = [sys.executable, "-m", "sweep.cli"]

TINY = """\
name: tiny
base:
  model: {vocab_size: 32, seq_len: 8, head_dim: 8}
  data: {kind: synthetic, order: 1, branching: 4}
  train: {batch_size: 4, lr: 3.0e-3, log_every: 5, stats_every: 50, eval_batches: 1}
axes:
  budget: [%(budgets)s]
  shape: [{d_model: 16, n_layers: 1}]
  precision:
    - {name: bf16_bf16, w_fmt: bf16, a_fmt: bf16}
filters: {min_steps: 5}
launch: {executor: local, workers: 1}
"""


def sweep(*args: str, env: dict | None = None, timeout: float = 600):
    return subprocess.run(
        [*SWEEP, *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def tiny_grid(tmp_path: Path, budgets: str = "2.0e+7, 4.0e+7", name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(TINY % {"budgets": budgets})
    return path


def status_json(sweep_dir: Path) -> dict:
    result = sweep("status", str(sweep_dir), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --- plan, schema, --dry-run ----------------------------------------------------------------


def test_plan_json_derives_steps_and_flops_from_the_budget(tmp_path):
    result = sweep("plan", str(tiny_grid(tmp_path)), "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    rows = sorted(plan["runs"], key=lambda r: r["budget"])
    assert [r["budget"] for r in rows] == [2e7, 4e7]
    for row in rows:
        # N counted as the paper does (embeddings and untied head), no attention FLOPs.
        n = 2 * 32 * 16 + 16 * 48 + 16 * 16 + 2 * 16 * 64 + 5 * 16
        assert row["N"] == n
        assert row["steps"] == int(row["budget"] // (6 * n) // (4 * 8))
        assert row["D"] == row["steps"] * 4 * 8
        assert row["C"] == pytest.approx(6 * row["N"] * row["D"])
        assert row["tokens_per_param"] == pytest.approx(row["D"] / row["N"])
    assert plan["totals"]["runs"] == 2
    assert plan["totals"]["flops"] == pytest.approx(sum(r["C"] for r in rows))


def test_schema_is_a_json_schema_of_the_grid_format():
    result = sweep("schema")
    assert result.returncode == 0, result.stderr
    schema = json.loads(result.stdout)
    assert schema["type"] == "object"
    assert {"name", "base", "axes", "filters", "launch"} <= set(schema["properties"])


def test_dry_run_shows_the_plan_and_creates_nothing(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = sweep("launch", str(tiny_grid(tmp_path)), "--sweep-dir", str(sweep_dir), "--dry-run")
    assert result.returncode == 0, result.stderr
    plan = sweep("plan", str(tiny_grid(tmp_path)))
    assert result.stdout == plan.stdout and "2" in plan.stdout
    assert not sweep_dir.exists()


# --- bad input: exit 2, a precise message, nothing launched ---------------------------------

BAD_GRIDS = {
    "unknown key": (
        "axes:\n  budget: [2.0e+7]\n  shape: [{d_model: 16}]\nfilterz: {}\n",
        "filterz",
    ),
    "wrong type": ("base:\n  train: {lr: fast}\naxes:\n  budget: [2.0e+7]\n", "fast"),
    "empty axis": ("axes:\n  budget: []\n", "budget"),
    "unknown format": (
        "axes:\n  budget: [2.0e+7]\n  precision: [{w_fmt: fp9, a_fmt: bf16}]\n",
        "fp9",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_GRIDS))
def test_each_bad_grid_class_exits_2_and_launches_nothing(tmp_path, case):
    body, named = BAD_GRIDS[case]
    grid = tmp_path / "bad.yaml"
    grid.write_text("name: bad\n" + body)
    sweep_dir = tmp_path / "sweep"
    for command in (("launch", str(grid), "--sweep-dir", str(sweep_dir)), ("plan", str(grid))):
        result = sweep(*command)
        assert result.returncode == 2, (case, result.stdout, result.stderr)
        assert "bad.yaml" in result.stderr and named in result.stderr, result.stderr
    assert not sweep_dir.exists()


def test_unknown_executor_and_changed_grid_exit_2(tmp_path):
    grid = tiny_grid(tmp_path, budgets="2.0e+7")
    sweep_dir = tmp_path / "sweep"
    bad = sweep("launch", str(grid), "--sweep-dir", str(sweep_dir), "--executor", "k8s")
    assert bad.returncode == 2 and "k8s" in bad.stderr and "local" in bad.stderr
    assert not sweep_dir.exists()
    assert sweep("launch", str(grid), "--sweep-dir", str(sweep_dir)).returncode == 0
    changed = tiny_grid(tmp_path, budgets="2.0e+7, 4.0e+7", name="changed.yaml")
    result = sweep("launch", str(changed), "--sweep-dir", str(sweep_dir))
    assert result.returncode == 2 and "different grid" in result.stderr
    assert "--update-grid" in result.stderr
    assert len(list((sweep_dir / "runs").iterdir())) == 1


# --- executors, cancel, logs, clean ----------------------------------------------------------


@pytest.mark.slow
def test_executor_auto_without_sbatch_runs_locally(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()  # a PATH without sbatch (or anything else)
    sweep_dir = tmp_path / "sweep"
    grid = tiny_grid(tmp_path, budgets="2.0e+7")
    result = sweep(
        "launch", str(grid), "--sweep-dir", str(sweep_dir), "--executor", "auto",
        env={"PATH": str(bare)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "submitted 1 via local" in result.stdout
    (run_dir,) = (sweep_dir / "runs").iterdir()
    assert json.loads((run_dir / "submitted.json").read_text())["executor"] == "local"
    assert status_json(sweep_dir)["counts"] == {"done": 1}


@pytest.mark.slow
def test_cancel_stops_a_running_run_as_cancelled(tmp_path):
    # Long enough to be caught running: 20k steps of a tiny model.
    grid = tiny_grid(tmp_path, budgets="3.0e+10")
    sweep_dir = tmp_path / "sweep"
    launcher = subprocess.Popen(
        [*SWEEP, "launch", str(grid), "--sweep-dir", str(sweep_dir)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            markers = list(sweep_dir.glob("runs/*/state.json"))
            marker = json.loads(markers[0].read_text()) if markers else {}
            if marker.get("state") == "running" and marker.get("step", 0) > 0:
                break
            assert launcher.poll() is None, launcher.stdout.read()
            assert time.monotonic() < deadline, "the run never reported a step"
            time.sleep(0.2)
        (run_dir,) = (sweep_dir / "runs").iterdir()
        cancelled = sweep("cancel", str(sweep_dir))
        assert cancelled.returncode == 0, cancelled.stderr
        assert "cancelled 1 run(s)" in cancelled.stdout
        launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    marker = json.loads((run_dir / "state.json").read_text())
    assert marker["state"] == "cancelled" and 0 < marker["step"] < 20_000, marker
    assert status_json(sweep_dir)["counts"] == {"cancelled": 1}

    logs = sweep("logs", str(sweep_dir), run_dir.name[:6])
    assert logs.returncode == 0, logs.stderr
    assert "attempt 1: starting" in logs.stdout and "attempt-1.log" in logs.stdout
    assert sweep("logs", str(sweep_dir), "zzzz").returncode == 2

    assert sweep("clean", str(sweep_dir)).returncode == 2  # needs --failed
    cleaned = sweep("clean", str(sweep_dir), "--failed")
    assert cleaned.returncode == 0 and "reset 1 run(s)" in cleaned.stdout
    assert [p.name for p in run_dir.iterdir()] == ["spec.json"]
    assert status_json(sweep_dir)["counts"] == {"pending": 1}


# --- atomic writes ---------------------------------------------------------------------------


@pytest.mark.slow
def test_sweep_run_writes_every_file_by_temp_and_rename(tmp_path):
    spec = RunSpec.model_validate(
        {
            "model": {"vocab_size": 32, "seq_len": 8, "head_dim": 8, "d_model": 16},
            "train": {"steps": 20, "batch_size": 4, "log_every": 1, "checkpoint_every": 5},
        }
    )
    run_dir = tmp_path / "runs" / spec.run_id
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(spec.model_dump_json())
    audit = tmp_path / "audit.json"
    code = (
        "import json, sys\n"
        "log, run_dir = [], sys.argv[1]\n"
        "def hook(event, args):\n"
        "    if event == 'os.rename' and str(args[1]).startswith(run_dir):\n"
        "        log.append(['rename', str(args[0]), str(args[1])])\n"
        "    elif event == 'open' and isinstance(args[0], str) and args[0].startswith(run_dir):\n"
        "        if any(c in str(args[1] or '') for c in 'wax+'):\n"
        "            log.append(['open', args[0], str(args[1])])\n"
        "sys.addaudithook(hook)\n"
        "from sweep.cli import app\n"
        "try:\n"
        "    app(['run', run_dir])\n"
        "except SystemExit as done:\n"
        "    json.dump({'code': done.code, 'log': log}, open(sys.argv[2], 'w'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(run_dir), str(audit)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(audit.read_text())
    assert report["code"] == 0
    renames = {dst: src for kind, src, dst in report["log"] if kind == "rename"}
    written = [
        run_dir / "state.json",
        run_dir / "summary.json",
        *sorted((run_dir / "metrics").glob("part-*.parquet")),
        *sorted((run_dir / "checkpoints").glob("step-*.pt")),
    ]
    assert len(written) >= 5
    for path in written:
        src = Path(renames[str(path)])  # reached its name by a rename ...
        # ... from a dot-prefixed temp file beside it
        assert src.parent == path.parent and src.name.startswith(f".{path.name}.")
        assert src.name.endswith(".tmp") and not src.exists()
    opened = {Path(p).name for kind, p, _ in report["log"] if kind == "open"}
    assert not opened & {p.name for p in written}, "a final file was opened for writing"
    leftovers = [p for p in run_dir.rglob(".*") if p.is_file()]
    assert leftovers == []


# --- analysis from the CLI -------------------------------------------------------------------


def test_paper_instability_table_from_the_cli(tmp_path):
    result = sweep("analyze", "--paper", "--table", "instability", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    with open(tmp_path / "instability.csv") as handle:
        table = list(csv.DictReader(handle))
    big = [c for c in table[0] if c not in ("config", "all") and float(c) >= 4.5e18]
    assert len(big) == 4

    def total(rows: list[dict]) -> tuple[int, int]:
        cells = [r[c].split("/") for r in rows for c in big if r[c]]
        return sum(int(u) for u, _ in cells), sum(int(t) for _, t in cells)

    fully_mx = [r for r in table if parse_config(r["config"]).fully_mx]
    assert total(fully_mx) == (76, 259)
    assert "wrote" in result.stdout and (tmp_path / "instability.md").is_file()


def test_analyze_needs_exactly_one_source_and_known_names(tmp_path):
    assert sweep("analyze", "--out", str(tmp_path)).returncode == 2
    result = sweep("analyze", "--paper", "--plot", "scatter", "--out", str(tmp_path))
    assert result.returncode == 2 and "scatter" in result.stderr


def test_n_is_the_models_parameter_count():
    # The plan's N (checked above by formula) is the parameter count of the real model.
    spec = RunSpec.model_validate(
        {
            "model": {"vocab_size": 32, "seq_len": 8, "head_dim": 8, "d_model": 16},
            "train": {"steps": 1},
        }
    )
    assert sum(p.numel() for p in TransformerLM(spec.model).parameters()) == (
        2 * 32 * 16 + 16 * 48 + 16 * 16 + 2 * 16 * 64 + 5 * 16
    )
