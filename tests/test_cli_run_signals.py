"""`sweep run RUN_DIR` (the command every executor calls) under a stop signal, without
SLURM: SIGUSR2 (what SLURM sends before a time limit) and SIGTERM (preemption) must end it
with exit code 75 after a checkpoint, and running it again must finish the same trajectory."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from metric_rows import comparable_rows

from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
from models.runner import train_run
from runfolder.paths import checkpoint_steps

ROOT = Path(__file__).resolve().parents[1]
SPEC = RunSpec(
    model=LMConfig(d_model=32, n_layers=1, head_dim=16, vocab_size=64, seq_len=16),
    data=SyntheticData(order=1, branching=4),
    train=TrainConfig(
        steps=120,
        batch_size=8,
        lr=3e-3,
        log_every=1,
        stats_every=40,
        eval_every=40,
        checkpoint_every=5,
    ),
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    train_run(SPEC, run_dir)
    return comparable_rows(run_dir)


def sweep_run(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sweep.cli", "run", str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGUSR2, signal.SIGTERM], ids=["sigusr2", "sigterm"])
def test_signalled_sweep_run_exits_75_and_resumes_on_the_same_trajectory(tmp_path, reference, sig):
    run_dir = tmp_path / "runs" / SPEC.run_id
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(SPEC.model_dump_json())
    child = sweep_run(run_dir)
    deadline = time.monotonic() + 120
    while not checkpoint_steps(run_dir / "checkpoints"):
        assert child.poll() is None, child.stdout.read()
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.01)
    child.send_signal(sig)
    output = child.communicate(timeout=120)[0]
    assert child.returncode == 75, output
    marker = json.loads((run_dir / "state.json").read_text())
    stopped = marker["step"]
    assert marker["state"] == "preempted" and 5 <= stopped < SPEC.train.steps, marker
    assert stopped == max(checkpoint_steps(run_dir / "checkpoints"))
    assert comparable_rows(run_dir)["step"].max() == stopped

    again = sweep_run(run_dir)
    output = again.communicate(timeout=300)[0]
    assert again.returncode == 0, output
    assert f"resuming from step {stopped}" in output
    marker = json.loads((run_dir / "state.json").read_text())
    assert (marker["state"], marker["step"]) == ("done", SPEC.train.steps)
    assert comparable_rows(run_dir).equals(reference)
