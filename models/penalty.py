"""Gradient terms added between the backward pass and the update: LOTION's smoothing."""

from __future__ import annotations

import torch

from models.config import LotionConfig
from models.lotion import lotion_penalty
from models.replica import Replica


class LotionTerm:
    """Adds the gradient of LOTION's smoothing term (see models.lotion) to the replica's
    gradients; keeps the last penalty for the ``lotion/penalty`` probe."""

    def __init__(self, cfg: LotionConfig) -> None:
        self.cfg = cfg
        self.penalty: torch.Tensor | None = None

    def add_gradient(self, replica: Replica) -> None:
        """Backpropagate the penalty of the replica's current weights and optimizer state."""
        penalty = lotion_penalty(replica.model, replica.optimizer, self.cfg.fmt, self.cfg.strength)
        if penalty.requires_grad:
            penalty.backward()
        self.penalty = penalty
