"""The learning-rate schedule: a pure function of the step, so a checkpoint's step is the
whole scheduler position."""

from __future__ import annotations

import math

from models.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of 0-based update ``step``: linear warmup from warmup_init_frac·lr over
    warmup_frac·steps, then cosine decay to final_lr_frac·lr at the last step (or constant
    with ``schedule: constant``)."""
    warmup = round(cfg.warmup_frac * cfg.steps)
    if step < warmup:
        frac = cfg.warmup_init_frac + (1 - cfg.warmup_init_frac) * step / warmup
        return cfg.lr * frac
    if cfg.schedule == "constant":
        return cfg.lr
    progress = (step - warmup) / max(1, cfg.steps - 1 - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.final_lr_frac + (1 - cfg.final_lr_frac) * cosine)
