"""The plot/table registry: the CLI help, `--plot all` and unknown names come from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from analysis import registry
from analysis.report import PLOTS, TABLES, analyze
from analysis.synthetic import write_synthetic_sweep

# Every name the CLI offered before the registry: none may disappear.
OLD_PLOTS = ("scaling", "contours", "curves", "instability", "frontier", "paired",
             "interventions", "isoflop", "confound", "quantized", "transfer")  # fmt: skip
OLD_TABLES = ("fits", "instability", "mitigations", "interventions", "paired", "isoflop",
              "confound", "transfer")  # fmt: skip


def _sweep_cli(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, "-m", "sweep.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


def test_every_old_name_is_registered_in_order():
    assert set(OLD_PLOTS) == set(PLOTS) and set(OLD_TABLES) == set(TABLES)
    assert PLOTS[:5] == OLD_PLOTS[:5] and TABLES[:3] == OLD_TABLES[:3]
    for kind in registry.KINDS:
        for item in registry.items(kind):
            assert item.description and item.needs.describe().startswith("run summaries")


def test_help_lists_every_registered_plot_and_table(repo_root):
    result = _sweep_cli("analyze", "--help", cwd=repo_root)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    plots, tables = text.split("Plots:")[1].split("Tables:")
    for item in registry.items("plot"):
        assert f"{item.name}: " in plots, item.name
    for item in registry.items("table"):
        assert f"{item.name}: " in tables, item.name
    options = text.split("Plots:")[0]
    for name in (*PLOTS, *TABLES):
        assert name in options  # the --plot/--table option help
    # What an item needs is shown: the paired plot's metric suffixes and its sweep folder.
    assert "*.fc1/a" in " ".join(plots.split()) and "not --paper" in plots


@pytest.mark.parametrize("kind", registry.KINDS)
def test_unknown_name_exits_2_listing_the_allowed(repo_root, tmp_path, kind):
    result = _sweep_cli(
        "analyze", "--paper", f"--{kind}", "scatter", "--out", str(tmp_path), cwd=repo_root
    )
    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert f"unknown {kind} ['scatter']" in message
    for name in registry.names(kind):
        assert name in message, name
    assert not any(tmp_path.iterdir())  # nothing written


def test_plot_all_writes_one_file_per_registered_plot(tmp_path):
    sweep = tmp_path / "sweep"
    write_synthetic_sweep(
        sweep,
        configs={"bf16_bf16": 1.0, "fp8_e4m3_fp8_e4m3": 0.7},
        budgets=[1e12, 1e13, 1e14],
        shapes=[(32, 1), (64, 1), (128, 2)],
        n_points=40,
    )
    for summary in sweep.glob("runs/*/summary.json"):  # so the quantized plot has its input
        record = json.loads(summary.read_text())
        record["final_val_loss_quantized"] = record["final_val_loss"] + 0.01
        summary.write_text(json.dumps(record))
    out = tmp_path / "out"
    paths = analyze(sweep, paper=False, plots=["all"], tables=[], out_dir=out, n_boot=0)
    written = {p.stem for p in paths if p.suffix == ".png"}
    index = (out / "index.md").read_text()
    skipped = {line[2:].split(":")[0] for line in index.split("## Skipped")[-1].splitlines()
               if line.startswith("- ")}  # fmt: skip
    # Each registered plot: its PNG (and PDF) or a reason; only the sweep-only studies that
    # this plain sweep has no runs for are skipped.
    assert written | skipped == set(PLOTS) and not written & skipped
    assert skipped == {"paired", "interventions", "confound"}
    for name in written:
        assert (out / f"{name}.png").stat().st_size > 10_000 and (out / f"{name}.pdf").is_file()
    sweep_only = {i.name for i in registry.items("plot") if i.needs.sweep_only}
    assert skipped <= sweep_only


def test_registering_twice_or_an_unknown_page_is_refused():
    def make(src, out_dir):
        return []

    with pytest.raises(ValueError, match="registered twice"):
        registry.plot("scaling", "another scaling plot")(make)
    with pytest.raises(ValueError, match="unknown report page 'nowhere'"):
        registry.table("x", "x", page="nowhere")(make)
    with pytest.raises(ValueError, match="unknown plot \\['x'\\]; allowed: scaling"):
        registry.select("plot", ["x"])
