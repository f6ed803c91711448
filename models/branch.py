"""Start state of a branched run: its parent's full training state after ``branch.step``.

A parent keeps only some checkpoints (the newest two and every ``keep_checkpoints_every``).
When none sits exactly at the branch step, the parent is replayed from its newest earlier
checkpoint (or from scratch) up to that step in a scratch folder. Training is a pure
function of spec, seed and step, so the replayed state is the state the parent had.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from models.checkpoint import load_checkpoint
from models.config import Branch, RunSpec
from runfolder.paths import checkpoint_path, checkpoint_steps


def branch_start_state(
    branch: Branch, runs_dir: Path, make_trainer: Callable[[RunSpec, Path], Any]
) -> dict[str, Any]:
    """The parent's state at ``branch.step``, reset to start a new run's own records.
    ``make_trainer(spec, run_dir)`` builds the parent's trainer for a replay."""
    parent_dir = runs_dir / branch.parent
    spec_path = parent_dir / "spec.json"
    if not spec_path.exists():
        raise FileNotFoundError(f"branch parent {branch.parent}: no {spec_path}")
    parent = RunSpec.model_validate_json(spec_path.read_text())
    if branch.step >= parent.train.steps:
        raise ValueError(
            f"branch step {branch.step} is not before the parent's last step {parent.train.steps}"
        )
    state = _exact(parent_dir / "checkpoints", branch.step) or _replay(
        parent, runs_dir, branch.step, make_trainer
    )
    tracker = state["tracker"]
    if tracker.get("diverged_step") is not None:
        raise ValueError(
            f"parent {branch.parent} diverged at step {tracker['diverged_step']}, before the "
            f"branch step {branch.step}; branch from an earlier step"
        )
    # The branch writes its own metrics from part 0 and times only its own training.
    return {**state, "n_parts": 0, "tracker": {**tracker, "wall_time_s": 0.0, "finished": False}}


def _exact(ckpt_dir: Path, step: int) -> dict[str, Any] | None:
    path = checkpoint_path(ckpt_dir, step)
    try:
        return load_checkpoint(path)
    except FileNotFoundError:
        return None


def _replay(
    parent: RunSpec, runs_dir: Path, step: int, make_trainer: Callable[[RunSpec, Path], Any]
) -> dict[str, Any]:
    """Retrain the parent from its newest checkpoint before ``step`` up to ``step``."""
    # Hidden folder next to the runs, so a parent that is itself a branch finds its own
    # parent the same way; per process, so concurrent arms never share one.
    scratch = runs_dir / f".replay-{parent.run_id}-{step}-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        _seed_scratch(runs_dir / parent.run_id / "checkpoints", scratch / "checkpoints", step)
        trainer = make_trainer(parent, scratch)
        trainer.run(until=step)
        if trainer.step != step:
            raise ValueError(
                f"parent {parent.run_id} stopped at step {trainer.step} "
                f"(diverged at {trainer.tracker.diverged_step}) before the branch step {step}"
            )
        return load_checkpoint(checkpoint_path(scratch / "checkpoints", step))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _seed_scratch(source: Path, target: Path, step: int) -> None:
    """Copy the parent's newest checkpoint at or before ``step`` (none: replay from 0)."""
    for candidate in reversed([s for s in checkpoint_steps(source) if s <= step]):
        target.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy2(checkpoint_path(source, candidate), checkpoint_path(target, candidate))
            return
        except FileNotFoundError:  # pruned by the still-running parent meanwhile
            continue
