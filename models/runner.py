"""The trainer a run needs, resumed from its folder (or its branch point), and the one call
that trains a run folder."""

from __future__ import annotations

from pathlib import Path

from models.branch import branch_start_state
from models.config import ProxyConfig, RunSpec
from models.paired import PairedTrainer
from models.train import Reporter, Trainer


def make_trainer(spec: RunSpec, run_dir: Path, reporter: Reporter | None = None) -> Trainer:
    """Paired FP32/MX for a paired proxy, else the plain trainer; resumed from the run's own
    checkpoint or, for a branch that has none yet, from its parent's state."""
    run_dir = Path(run_dir)
    paired = isinstance(spec.model, ProxyConfig) and spec.model.paired
    trainer = (PairedTrainer if paired else Trainer)(spec, run_dir, reporter)
    branch = spec.branch
    if branch is None:
        return trainer.resume()
    return trainer.resume(lambda: branch_start_state(branch, run_dir.parent, make_trainer))


def train_run(spec: RunSpec, run_dir: Path, reporter: Reporter | None = None) -> dict:
    """Train (resuming from run_dir/checkpoints if present); return the summary dict."""
    return make_trainer(spec, run_dir, reporter).run()
