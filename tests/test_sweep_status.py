"""`sweep status`: counts and rows from the run folders, its fast entry point, its tables."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from sweep.status import aligned_table
from sweep.store import SweepStore

# (config, budget, state written by the run, or None: never started)
RUNS = [
    ("bf16", 1e9, "done"),
    ("bf16", 1e9, "done"),
    ("bf16", 3e9, "diverged"),
    ("fp8", 1e9, "failed"),
    ("fp8", 3e9, "done"),
    ("fp8", 3e9, None),
]


@pytest.fixture
def sweep_dir(tmp_path: Path) -> Path:
    """Six runs in terminal or pending states: no scheduler is asked about any of them."""
    store = SweepStore(tmp_path / "sweep")
    ids = [f"run{i}" for i in range(len(RUNS))]
    store.initialise("name: t\n", ids, update_grid=False)
    for i, (config, budget, state) in enumerate(RUNS):
        spec = {
            "budget": budget,
            "seed": i,
            "model": {"d_model": 32},
            "train": {"steps": 100},
            "tags": {"config": config},
        }
        run_dir = store.write_spec(ids[i], json.dumps(spec))
        if state is not None:
            marker = {"state": state, "step": 100 if state == "done" else 40, "attempt": 1}
            if state == "failed":
                marker["reason"] = "RuntimeError: [boom]"
            marker["last_loss"] = 2.5 + i
            (run_dir / "state.json").write_text(json.dumps(marker))
    return store.root


def _sweep(*args: str, module: str = "sweep", flags: tuple[str, ...] = ()):
    return subprocess.run(
        [sys.executable, *flags, "-m", module, *args], capture_output=True, text=True, timeout=60
    )


def test_json_counts_and_rows(sweep_dir: Path):
    result = _sweep("status", str(sweep_dir), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["counts"] == {"pending": 1, "done": 3, "diverged": 1, "failed": 1}
    rows = {row["run_id"]: row for row in report["runs"]}
    assert [rows[f"run{i}"]["state"] for i in range(6)] == [
        "done",
        "done",
        "diverged",
        "failed",
        "done",
        "pending",
    ]
    assert rows["run3"]["reason"] == "RuntimeError: [boom]"
    assert (rows["run3"]["step"], rows["run3"]["total_steps"], rows["run3"]["loss"]) == (
        40,
        100,
        5.5,
    )
    assert rows["run5"]["loss"] is None and rows["run5"]["attempt"] == 0


def test_status_process_imports_no_heavy_module(sweep_dir: Path):
    # torch, pydantic (typer's coercion) and pandas each cost tenths of a second at start.
    result = _sweep("status", str(sweep_dir), "--json", flags=("-X", "importtime"))
    assert result.returncode == 0, result.stderr
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
    assert "sweep.status" in imported
    heavy = {"torch", "pydantic", "typer", "pandas", "numpy", "yaml", "rich", "models.config"}
    assert not heavy & imported


def test_tables_count_per_config_and_budget_and_list_every_run(sweep_dir: Path):
    result = _sweep("status", str(sweep_dir))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "6 runs by state"
    header = lines[1]
    assert header == "config  budget (FLOPs)  pending  done  diverged  failed"

    def cells(line: str) -> list[str]:
        # Every column here is as wide as its name; counts are right-aligned, blank when zero.
        names = ("config", "budget (FLOPs)", "pending", "done", "diverged", "failed")
        return [line[header.index(n) : header.index(n) + len(n)].strip() for n in names]

    assert [cells(line) for line in lines[3:8]] == [
        ["bf16", "1e+09", "", "2", "", ""],
        ["bf16", "3e+09", "", "", "1", ""],
        ["fp8", "1e+09", "", "", "", "1"],
        ["fp8", "3e+09", "1", "1", "", ""],
        ["total", "", "1", "3", "1", "1"],
    ]
    runs = lines[lines.index("runs") + 3 :]
    assert [line.split()[0] for line in runs] == [f"run{i}" for i in range(6)]
    state_at = lines[lines.index("runs") + 1].index("state")
    assert [line[state_at:].split()[0] for line in runs] == [s or "pending" for *_, s in RUNS]
    assert "RuntimeError: [boom]" in runs[3]
    assert all(line == line.rstrip() for line in lines)

    no_runs = _sweep("status", str(sweep_dir), "--no-runs")
    assert no_runs.stdout.splitlines() == lines[:8]


def test_typer_command_passes_through_to_the_same_output(sweep_dir: Path):
    fast = _sweep("status", str(sweep_dir), "--json")
    typer = _sweep("status", str(sweep_dir), "--json", module="sweep.cli")
    assert typer.returncode == 0, typer.stderr
    assert typer.stdout == fast.stdout


def test_not_a_sweep_folder_exits_2(tmp_path: Path):
    result = _sweep("status", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert "nowhere: not a sweep folder" in result.stderr
    assert _sweep("status").returncode == 2


def test_aligned_table_styles_only_the_styled_cells():
    console = Console(force_terminal=True, color_system="standard", width=80)
    with console.capture() as captured:
        console.print(
            aligned_table("t", ["a", "n"], [["x", ("10", "green")], ["yyy", "7"]], right={1})
        )
    lines = captured.get().splitlines()
    assert lines[3] == "x    \x1b[32m10\x1b[0m"
    assert lines[4] == "yyy   7"
