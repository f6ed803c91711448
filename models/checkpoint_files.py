"""Checkpoint file names, torch-free so that `sweep status` can read resume points fast."""

from __future__ import annotations

import re
from pathlib import Path

_NAME = re.compile(r"step-(\d{9})\.pt")


def checkpoint_steps(ckpt_dir: Path) -> list[int]:
    """Steps of the checkpoints present, ascending (temp files are ignored)."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in ckpt_dir.iterdir() if (m := _NAME.fullmatch(p.name)))


def checkpoint_path(ckpt_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return ckpt_dir / f"step-{step:09d}.pt"
