"""`sweep intervene` end to end: branch a paired proxy run, reproduce it, tabulate the arms."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.interventions import classify, spliced, trouble_step

SWEEP = [sys.executable, "-m", "sweep.cli"]
ROOT = Path(__file__).resolve().parents[1]


def sweep(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*SWEEP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def _metrics(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / "metrics")
    frame["name"] = frame["name"].astype(str)
    return frame[~frame["name"].str.startswith("perf/")][["step", "name", "value"]]


def _branches(sweep_dir: Path) -> dict[tuple[int, str], Path]:
    found = {}
    for spec_path in (sweep_dir / "runs").glob("*/spec.json"):
        branch = json.loads(spec_path.read_text()).get("branch")
        if branch:
            found[(branch["step"], branch["arm"])] = spec_path.parent
    return found


@pytest.fixture(scope="module")
def parent_sweep(tmp_path_factory):
    """The micro proxy grid launched once: an FP32 and a paired MX E4M3 run of 60 steps."""
    sweep_dir = tmp_path_factory.mktemp("proxy") / "sweep"
    grid = ROOT / "tests" / "grids" / "proxy_micro.yaml"
    launched = sweep("launch", str(grid), "--sweep-dir", str(sweep_dir), cwd=ROOT)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    mx_parent = next(
        p.parent.name
        for p in (sweep_dir / "runs").glob("*/spec.json")
        if json.loads(p.read_text())["precision"]["w_fmt"] == "fp8_e4m3"
    )
    return sweep_dir, mx_parent


@pytest.mark.slow
def test_control_arm_reproduces_the_parent_bit_for_bit(parent_sweep, repo_root):
    sweep_dir, parent = parent_sweep
    # Step 40 has a kept checkpoint (keep_checkpoints_every: 20); step 33 needs a replay.
    out = sweep(
        "intervene", parent[:6], "--sweep-dir", str(sweep_dir), "--at", "40",
        "--before", "0", "--before", "7", "--arms", "control,full_precision,rceil,no_ln_quant",
        cwd=repo_root,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "branching at step(s) 33, 40" in out.stdout
    assert "submitted 8 run(s) via local" in out.stdout
    branches = _branches(sweep_dir)
    assert len(branches) == 8
    parent_rows = _metrics(sweep_dir / "runs" / parent)
    for step in (33, 40):
        control = _metrics(branches[(step, "control")])
        assert control["step"].min() == step + 1
        after = parent_rows[parent_rows["step"] > step]
        merged = after.merge(control, on=["step", "name"], how="outer", suffixes=("", "_arm"))
        assert len(merged) == len(after) == len(control)
        assert (merged["value"] == merged["value_arm"]).all(), "control drifted from the parent"
        full_dir = branches[(step, "full_precision")]
        assert json.loads((full_dir / "spec.json").read_text())["precision"]["w_fmt"] == "fp32"
        full = _metrics(full_dir)
        loss = full[full["name"] == "train/loss"].set_index("step")["value"]
        parent_loss = after[after["name"] == "train/loss"].set_index("step")["value"]
        # It starts from the parent's weights: close at first, then its own trajectory.
        assert abs(loss.iloc[0] / parent_loss.iloc[0] - 1) < 0.05
        assert (loss != parent_loss).mean() > 0.9
        assert "mx/clip/blocks.0.fc1/a" not in set(full["name"])

    # Relaunching the same intervention submits nothing; status lists the branches.
    again = sweep(
        "intervene", parent, "--sweep-dir", str(sweep_dir), "--at", "40",
        "--arms", "control", cwd=repo_root,
    )  # fmt: skip
    assert "submitted 0 run(s)" in again.stdout, again.stdout + again.stderr
    status = json.loads(sweep("status", str(sweep_dir), "--json", cwd=repo_root).stdout)
    assert status["counts"] == {"done": 10}

    analyzed = sweep(
        "analyze", str(sweep_dir), "--plot", "interventions", "--plot", "paired",
        "--table", "interventions", cwd=repo_root,
    )  # fmt: skip
    assert analyzed.returncode == 0, analyzed.stdout + analyzed.stderr
    figures = sweep_dir / "figures"
    assert (figures / "interventions.png").stat().st_size > 10_000
    assert (figures / "paired.png").stat().st_size > 10_000
    table = pd.read_csv(figures / "interventions.csv")
    assert len(table) == 8 and set(table["outcome"]) <= {"stable", "diverged"}
    control = table[table["arm"] == "control"]
    assert (control["final_train_loss"] == control["parent_final_train_loss"]).all()


@pytest.mark.slow
def test_branch_at_a_detected_onset(tmp_path, repo_root):
    """An edge-of-stability spike (lr 0.3 after warmup, any precision) as the test subject:
    the onset is found in the loss, the control re-diverges at the same step."""
    grid = yaml.safe_load((repo_root / "tests" / "grids" / "proxy_micro.yaml").read_text())
    grid["base"]["train"].update(
        {"lr": 0.3, "warmup_frac": 0.5, "warmup_init_frac": 0.01, "steps": 90}
    )
    grid["axes"]["precision"] = grid["axes"]["precision"][1:]
    path = tmp_path / "unstable.yaml"
    path.write_text(yaml.safe_dump(grid))
    sweep_dir = tmp_path / "sweep"
    assert sweep("launch", str(path), "--sweep-dir", str(sweep_dir), cwd=repo_root).returncode == 0
    parent = next((sweep_dir / "runs").iterdir()).name
    out = sweep(
        "intervene", parent, "--sweep-dir", str(sweep_dir), "--at", "onset", "--before", "8",
        "--arms", "control,full_precision", cwd=repo_root,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "detected onset at step" in out.stdout
    onset = int(out.stdout.split("detected onset at step ")[1].split(";")[0])
    assert 20 < onset < 80
    assert f"branching at step(s) {onset - 8}" in out.stdout
    analyzed = sweep("analyze", str(sweep_dir), "--table", "interventions", cwd=repo_root)
    assert analyzed.returncode == 0, analyzed.stderr
    table = pd.read_csv(sweep_dir / "figures" / "interventions.csv").set_index("arm")
    assert table.loc["control", "outcome"] == "diverged"
    assert table.loc["control", "arm_trouble_step"] == table.loc["control", "parent_trouble_step"]
    assert table.loc["full_precision", "outcome"] in ("diverged", "delayed", "averted")


def test_bad_requests_exit_2_and_register_nothing(parent_sweep, repo_root):
    sweep_dir, parent = parent_sweep
    before = (sweep_dir / "sweep.json").read_text()
    cases = [
        (["--at", "30", "--arms", "control,fp4"], ["unknown arm 'fp4'", "full_precision"]),
        (["--at", "60"], ["branch step 60", "1..59"]),
        (["--at", "soon"], ["--at", "'soon'", "onset"]),
    ]
    for args, needles in cases:
        out = sweep("intervene", parent, "--sweep-dir", str(sweep_dir), *args, cwd=repo_root)
        assert out.returncode == 2, out.stdout + out.stderr
        for needle in needles:
            assert needle in out.stderr, (needle, out.stderr)
    missing = sweep(
        "intervene", "ffffff", "--sweep-dir", str(sweep_dir), "--at", "10", cwd=repo_root
    )
    assert missing.returncode == 2 and "no run match 'ffffff'" in missing.stderr
    assert (sweep_dir / "sweep.json").read_text() == before


def test_outcome_rules():
    assert classify(None, None, 10) == "stable"
    assert classify(None, 50, 10) == "diverged"
    assert classify(50, None, 10) == "averted"
    assert classify(50, 50, 10) == "diverged"
    assert classify(50, 40, 10) == "diverged"
    # 40 steps from branch to trouble: within 10 steps later is noise, beyond is a delay.
    assert classify(50, 60, 10) == "diverged"
    assert classify(50, 61, 10) == "delayed"
    steps = range(1, 201)
    parent = pd.Series([1.0 / s if s < 120 else 5.0 for s in steps], index=steps)
    calm = pd.Series([1.0 / s for s in steps], index=steps)
    assert trouble_step(parent, after=100) == 120
    assert trouble_step(spliced(parent, calm, 100), after=100) is None
