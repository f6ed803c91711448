"""Paired FP32/MX training: the run's (MX) network and an FP32 twin, same start, same batches.

Both start from the same initial weights and see the same batch at every step, each with
its own optimizer, so any difference between them is due to precision. At every logged step
the gradient bias between the two runs is recorded, overall and per residual block:
cosine, relative error ‖g_mx − g_fp32‖²/‖g_fp32‖² and ζ = ⟨g_mx, g_fp32⟩/‖g_fp32‖² − 1
(the paper's multiplicative bias ĝ = (1+ζ)·g, projected on g; logged by models.probes).
The twin is a component the trainer is given (models.runner decides), not a subclass.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
from torch import nn

from models.config import TrainConfig
from models.replica import Batch, Replica
from runfolder.metrics import PAIRED_PREFIX

_BLOCK = re.compile(r"^(blocks\.\d+)\.")


def _group(name: str) -> str:
    match = _BLOCK.match(name)
    return match.group(1) if match else "other"


def gradient_bias(mx_model: nn.Module, fp32_model: nn.Module) -> dict[str, float]:
    """Gradient agreement of two same-shaped models whose ``.grad`` are filled."""
    sums: dict[str, torch.Tensor] = {}
    pairs = zip(mx_model.named_parameters(), fp32_model.parameters(), strict=True)
    for (name, p_mx), p_fp in pairs:
        if p_mx.grad is None and p_fp.grad is None:
            continue
        # A parameter without a gradient (the paper's frozen LN bias) contributes zeros.
        a, b = (
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double()
            for p in (p_mx, p_fp)
        )
        terms = torch.stack([(a * b).sum(), (b * b).sum(), (a * a).sum(), (a - b).square().sum()])
        key = _group(name)
        sums[key] = sums[key] + terms if key in sums else terms
    values: dict[str, float] = {}
    total = torch.stack(list(sums.values())).sum(0)
    for key, terms in [("all", total), *sorted(sums.items())]:
        dot, fp_sq, mx_sq, diff_sq = terms.tolist()
        prefix = PAIRED_PREFIX if key == "all" else f"{PAIRED_PREFIX}{key}/"
        values[prefix + "grad_cos"] = dot / max((fp_sq * mx_sq) ** 0.5, 1e-300)
        values[prefix + "grad_rel_err"] = diff_sq / max(fp_sq, 1e-300)
        values[prefix + "grad_zeta"] = dot / max(fp_sq, 1e-300) - 1.0
    return values


class FP32Twin:
    """The FP32 reference of a paired run: a copy of the initial (unquantized) network with
    its own optimizer, stepped on the main run's batches and learning rates. It computes in
    plain FP32 (no autocast, fp32 weights) whatever ``train`` says, in this process alone."""

    def __init__(self, model: nn.Module, cfg: TrainConfig, device: torch.device) -> None:
        # mx.apply shares the Parameter objects, so the copy must be taken before it.
        self.replica = Replica(
            copy.deepcopy(model), cfg, device, autocast="none", param_dtype="fp32"
        )
        self.model = self.replica.model
        self.loss: torch.Tensor | None = None

    def forward_backward(self, batch: Batch) -> None:
        """Fill the twin's gradients on the main run's batch (its loss is kept)."""
        self.loss = self.replica.forward_backward(batch)

    def update(self, lr: float) -> None:
        """Step the twin's optimizer with the main run's learning rate."""
        self.replica.update(lr)

    def val_loss(self, batches: list[Any]) -> float:
        """The twin's mean loss over the validation batches."""
        return self.replica.mean_loss(batches)

    def state(self) -> dict[str, Any]:
        """The twin's part of the run's checkpoint."""
        state = self.replica.state()
        return {"twin_model": state["model"], "twin_optimizer": state["optimizer"]}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore the twin from a checkpoint ``state`` wrote."""
        self.replica.load_state(
            {"model": state["twin_model"], "optimizer": state["twin_optimizer"]}
        )
