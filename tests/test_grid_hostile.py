"""Hostile and sloppy grids: each is refused with exit 2 and a message, or accepted as meant."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sweep.cli import EXIT_RUNS_FAILED, app
from sweep.grid import GridError, expand_grid, load_grid
from sweep.safe_yaml import MAX_DEPTH, YamlBudgetError, load_untrusted

BASE = "base: {model: {vocab_size: 64, seq_len: 16, head_dim: 16}, train: {batch_size: 4}}\n"


def plan(tmp_path: Path, text: str, *extra: str):
    path = tmp_path / "grid.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["plan", str(path), "--json", *extra])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def test_infinite_budget_exits_2_naming_the_key(tmp_path):
    result = plan(tmp_path, f"name: g\n{BASE}axes: {{budget: [.inf], d_model: [32]}}\n")
    assert result.exit_code == 2
    assert "axes.budget[0]" in result.output and "not a finite number" in result.output


@pytest.mark.parametrize("value", ["-.inf", ".nan"])
def test_non_finite_anywhere_is_refused(tmp_path, value):
    text = f"name: g\n{BASE}axes: {{train.lr: [1.0e-3, {value}], d_model: [32]}}\n"
    result = plan(
        tmp_path, text.replace("train: {batch_size: 4}", "train: {batch_size: 4, steps: 5}")
    )
    assert result.exit_code == 2 and "axes.train.lr[1]" in result.output


def test_numeric_strings_are_numbers(tmp_path):
    text = f"name: g\n{BASE}axes: {{budget: [1e11, '4e10', 2E+11], d_model: [32]}}\n"
    result = plan(tmp_path, text)
    assert result.exit_code == 0, result.output
    budgets = sorted(row["budget"] for row in json.loads(result.output)["runs"])
    assert budgets == [4e10, 1e11, 2e11]
    # The YAML 1.2 float syntax reaches every number, not only budgets.
    assert load_untrusted("lr: 3e-4\nsteps: 1e3\nname: 1e3x") == {
        "lr": 3e-4,
        "steps": 1000.0,
        "name": "1e3x",
    }


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".hidden", "", "x" * 101, "名前"])
def test_sweep_name_must_be_a_slug(tmp_path, name):
    result = plan(
        tmp_path, f"name: {json.dumps(name)}\n{BASE}axes: {{budget: [1e11], d_model: [32]}}\n"
    )
    assert result.exit_code == 2 and "name: must be a slug" in result.output


def test_alias_bomb_is_refused_in_under_a_second(tmp_path):
    lines = ["name: g", "a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 8)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + f"\n{BASE}axes: {{budget: [1e11], seed: *a7}}\n")
    started = time.perf_counter()
    with pytest.raises(GridError, match="expands to more than"):
        load_grid(path)
    assert time.perf_counter() - started < 1.0


def test_a_few_honest_aliases_still_work(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(
        f"name: g\n{BASE}axes:\n  budget: [1e11]\n  d_model: [32]\n"
        "  precision: [&p {name: a, w_fmt: bf16, a_fmt: bf16}, {<<: *p, name: b}]\n"
    )
    runs = expand_grid(load_grid(path), path).runs
    assert sorted(spec.tags["config"] for spec in runs) == ["a", "b"]


def test_deep_and_huge_documents_are_refused():
    with pytest.raises(YamlBudgetError, match="deeper than"):
        load_untrusted("a: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5))
    with pytest.raises(YamlBudgetError, match="deeper than"):
        load_untrusted("a: " + "[" * 5000 + "]" * 5000)
    with pytest.raises(YamlBudgetError, match="larger than"):
        load_untrusted("a: [" + "1, " * 600_000 + "1]")
    with pytest.raises(YamlBudgetError, match="deeper than"):
        load_untrusted("&a [*a]")  # a recursive alias


# Runs of a fixed shape and length (no budget or d_model axis needed).
FIXED = BASE.replace("head_dim: 16", "head_dim: 16, d_model: 32").replace(
    "batch_size: 4", "batch_size: 4, steps: 2"
)


def test_grid_over_max_runs_asks_for_yes(tmp_path):
    text = f"name: g\n{FIXED}axes: {{seed: {{geomspace: [1, 2, 3]}}}}\n"
    assert plan(tmp_path, text).exit_code == 2  # geomspace only for budget
    text = (
        f"name: g\n{FIXED}"
        "axes: {seed: [0, 1, 2, 3, 4, 5], train.lr: [1.0e-3, 2.0e-3]}\nlaunch: {max_runs: 10}\n"
    )
    refused = plan(tmp_path, text)
    assert refused.exit_code == 2
    assert "12 points" in refused.output and "launch.max_runs=10" in refused.output
    assert "--yes" in refused.output
    accepted = plan(tmp_path, text, "--yes")
    assert accepted.exit_code == 0 and json.loads(accepted.output)["totals"]["runs"] == 12
    # The default limit is 20,000 points, checked before any point is built.
    grid_path = tmp_path / "big.yaml"
    grid_path.write_text(
        f"name: g\n{FIXED}"
        f"axes: {{seed: {list(range(200))}, train.lr: {[1e-3 + i * 1e-6 for i in range(101)]}}}\n"
    )
    started = time.perf_counter()
    with pytest.raises(GridError, match="20,200 points"):
        expand_grid(load_grid(grid_path), grid_path)
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize(
    ("axes", "needle"),
    [
        ("{budget: [1e11], shape: [[1, 2]]}", "axes.shape[0]: expected a d_model or a mapping"),
        ("{budget: [1e11], d_model: [32], model.x.y: [1]}", "axes.model.x.y[0]"),
        ("{budget: [1e400], d_model: [32]}", "axes.budget[0]"),
        ("{budget: {geomspace: [1e10, 1e11, 1000000000]}, d_model: [32]}", "geomspace num"),
    ],
)
def test_malformed_axes_exit_2_with_their_key(tmp_path, axes, needle):
    result = plan(tmp_path, f"name: g\n{BASE}axes: {axes}\n")
    assert result.exit_code == 2 and needle in result.output, result.output


def test_base_section_that_is_not_a_mapping(tmp_path):
    result = plan(tmp_path, "name: g\nbase: {model: -1}\naxes: {budget: [1e11], d_model: [32]}\n")
    assert result.exit_code == 2 and "base: model: expected a mapping, got -1" in result.output


@pytest.mark.slow
def test_blocking_launch_with_failed_runs_exits_3(tmp_path, repo_root):
    """Runs that crash at start (a Markov branching wider than the vocabulary) fail; the
    launch that ran them says so in its exit code."""
    grid = tmp_path / "fail.yaml"
    grid.write_text(
        "name: fail\n"
        "base: {model: {vocab_size: 16, seq_len: 8, head_dim: 16}, "
        "data: {kind: synthetic, branching: 64}, train: {batch_size: 2, steps: 3}}\n"
        "axes: {d_model: [16], seed: [0, 1]}\nlaunch: {executor: local, workers: 1}\n"
    )
    sweep_dir = tmp_path / "sweep"
    result = subprocess.run(
        [sys.executable, "-m", "sweep.cli", "launch", str(grid), "--sweep-dir", str(sweep_dir)],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == EXIT_RUNS_FAILED == 3, result.stdout + result.stderr
    # launch.max_retries (default 1): each crash ran once more in the same launch.
    assert "retried 2 crashed run(s)" in result.stdout and "submitted 4 via local" in result.stdout
    assert "2 run(s) failed" in result.stdout
    markers = [json.loads(p.read_text()) for p in sweep_dir.glob("runs/*/state.json")]
    assert [(m["state"], m["attempt"]) for m in markers] == [("failed", 2)] * 2
    assert all(m["reason"].startswith("ValueError: branching=64 exceeds") for m in markers)
    # Every attempt recorded which code it ran (sweep.provenance).
    for path in sweep_dir.glob("runs/*/provenance.json"):
        provenance = json.loads(path.read_text())
        assert [a["attempt"] for a in provenance["attempts"]] == [1, 2]
        # Local runs train in the launcher's workers: the command is the launch's.
        assert "launch" in provenance["command"] and provenance["commit"]
    assert len(list(sweep_dir.glob("runs/*/provenance.json"))) == 2
    # The budget is spent: the next launch leaves them failed.
    again = subprocess.run(
        [sys.executable, "-m", "sweep.cli", "launch", str(grid), "--sweep-dir", str(sweep_dir)],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "submitted 0" in again.stdout and "2 failed" in again.stdout
