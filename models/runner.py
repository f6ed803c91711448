"""The trainer a run needs, resumed from its folder (or its branch point), and the one call
that trains a run folder. The components that differ between runs are chosen here: a
paired run's FP32 twin and a branch's start state."""

from __future__ import annotations

from pathlib import Path

from models.branch import BranchStart
from models.config import RunSpec
from models.paired import FP32Twin
from models.train import Reporter, Trainer


def make_trainer(spec: RunSpec, run_dir: Path, reporter: Reporter | None = None) -> Trainer:
    """The run's trainer (with an FP32 twin when its model config asks for ``paired``),
    resumed from the run's own checkpoint or, for a branch that has none yet, from its
    parent's state."""
    run_dir = Path(run_dir)
    # A model config with ``paired: true`` (the proxy's) trains an FP32 twin alongside.
    twin = FP32Twin if getattr(spec.model, "paired", False) else None
    trainer = Trainer(spec, run_dir, reporter, twin=twin)
    if spec.branch is None:
        return trainer.resume()
    return trainer.resume(BranchStart(spec.branch, run_dir.parent, make_trainer))


def train_run(spec: RunSpec, run_dir: Path, reporter: Reporter | None = None) -> dict:
    """Train (resuming from run_dir/checkpoints if present); return the summary dict."""
    return make_trainer(spec, run_dir, reporter).run()
