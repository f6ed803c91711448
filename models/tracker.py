"""Run-level facts carried across resumes inside each checkpoint, and the divergence rule."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Tracker:
    """What a run has seen so far: losses for the summary, divergence, time spent."""

    initial_loss: float | None = None
    last_train_loss: float | None = None
    val_losses: list[float] = field(default_factory=list)
    val_losses_quantized: list[float] = field(default_factory=list)
    above_initial: int = 0
    diverged_step: int | None = None
    finished: bool = False
    wall_time_s: float = 0.0

    def observe(self, step: int, loss: float, window: int) -> None:
        """Record a logged train loss; mark divergence on NaN/Inf or a sustained rise."""
        self.last_train_loss = loss
        if self.initial_loss is None:
            self.initial_loss = loss
        self.above_initial = self.above_initial + 1 if loss > self.initial_loss else 0
        if not math.isfinite(loss) or self.above_initial >= window:
            self.diverged_step = step
