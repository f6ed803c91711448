"""Kill a run (SIGKILL, and SIGTERM -> checkpoint + Preempted), resume, compare bit for bit."""

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
PREEMPTED_EXIT = 3
# The child trains with a reporter that sleeps, so the parent can kill it mid-run.
CHILD = f"""
import sys, time
from pathlib import Path
from models.config import RunSpec
from models.runner import train_run
from models.train import Preempted

class Slow:
    def progress(self, step, total_steps, loss):
        time.sleep(0.03)

spec = RunSpec.model_validate_json(Path(sys.argv[1]).read_text())
try:
    train_run(spec, Path(sys.argv[2]), Slow())
except Preempted:
    sys.exit({PREEMPTED_EXIT})
"""
SPEC = RunSpec(
    model=LMConfig(d_model=32, head_dim=32, vocab_size=64, seq_len=16),
    data=SyntheticData(order=1, branching=4),
    train=TrainConfig(
        steps=60,
        batch_size=8,
        micro_batch_size=4,
        lr=3e-3,
        log_every=1,
        stats_every=5,
        eval_every=20,
        checkpoint_every=7,
    ),
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    return train_run(SPEC, run_dir), comparable_rows(run_dir)


def _interrupt(run_dir: Path, sig: int, after_checkpoint_step: int) -> int:
    spec_file = run_dir.parent / f"{run_dir.name}.json"
    spec_file.write_text(SPEC.model_dump_json())
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(spec_file), str(run_dir)], cwd=ROOT)
    deadline = time.time() + 60
    while not any(s >= after_checkpoint_step for s in checkpoint_steps(run_dir / "checkpoints")):
        assert child.poll() is None and time.time() < deadline, "child ended before the kill"
        time.sleep(0.02)
    child.send_signal(sig)
    return child.wait(timeout=60)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_resume_continues_the_same_trajectory(tmp_path, reference, sig):
    ref_summary, ref_rows = reference
    run_dir = tmp_path / "run"
    code = _interrupt(run_dir, sig, after_checkpoint_step=14)
    steps = checkpoint_steps(run_dir / "checkpoints")
    assert steps and max(steps) < SPEC.train.steps
    if sig == signal.SIGTERM:
        assert code == PREEMPTED_EXIT
        # The signal's checkpoint and the metric rows up to it were written together.
        assert comparable_rows(run_dir).step.max() == max(steps)
    else:
        assert code == -signal.SIGKILL
    summary = train_run(SPEC, run_dir)
    assert comparable_rows(run_dir).equals(ref_rows)
    for key in (
        "final_val_loss",
        "min_val_loss",
        "final_train_loss",
        "initial_loss",
        "state",
        "steps_done",
    ):
        assert summary[key] == ref_summary[key]
