"""Training checkpoints: atomic files named by step (runfolder.paths), newest first on load,
a few kept."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from runfolder.atomic import atomic_write
from runfolder.paths import checkpoint_path, checkpoint_steps


def save_checkpoint(
    ckpt_dir: Path, step: int, state: dict[str, Any], keep: int = 2, keep_every: int | None = None
) -> Path:
    """Write ``state`` as the checkpoint of ``step``, then prune all but the newest ``keep``
    and those at multiples of ``keep_every`` (kept as branch points)."""
    path = atomic_write(checkpoint_path(ckpt_dir, step), lambda tmp: torch.save(state, tmp))
    for old in checkpoint_steps(ckpt_dir)[:-keep]:
        if not (keep_every and old % keep_every == 0):
            checkpoint_path(ckpt_dir, old).unlink(missing_ok=True)
    return path


def finite_state(state: Any) -> bool:
    """True when every floating-point tensor in a nested state is finite: a
    diverged run's NaN/Inf weights or optimizer moments must never become a checkpoint."""
    stack = [state]
    while stack:
        node = stack.pop()
        if isinstance(node, torch.Tensor):
            if node.is_floating_point() and not bool(torch.isfinite(node).all()):
                return False
        elif isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)
    return True


def load_checkpoint(path: Path) -> dict[str, Any]:
    """One checkpoint file's state (CPU tensors)."""
    return torch.load(path, map_location="cpu", weights_only=False)


def load_latest(ckpt_dir: Path) -> dict[str, Any] | None:
    """The newest checkpoint that loads and holds a finite state, or None when there is none.

    Writes are atomic, so an unreadable file means outside damage; it is skipped with a
    warning rather than ending the run, and the next older checkpoint is used. So is a
    poisoned one (NaN/Inf, written before checkpoints were checked): resuming from it
    could only diverge again.
    """
    for step in reversed(checkpoint_steps(ckpt_dir)):
        path = checkpoint_path(ckpt_dir, step)
        try:
            state = load_checkpoint(path)
        except Exception as err:  # any unreadable file is treated alike
            warnings.warn(f"skipping unreadable checkpoint {path}: {err}", stacklevel=2)
            continue
        if finite_state(state):
            return state
        warnings.warn(f"skipping checkpoint {path}: non-finite state", stacklevel=2)
    return None
