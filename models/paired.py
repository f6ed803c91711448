"""Paired FP32/MX training: the run's (MX) network and an FP32 twin, same start, same batches.

Both start from the same initial weights and see the same batch at every step, each with
its own optimizer, so any difference between them is due to precision. At every logged step
the gradient bias between the two runs is recorded, overall and per residual block:
cosine, relative error ‖g_mx − g_fp32‖²/‖g_fp32‖² and ζ = ⟨g_mx, g_fp32⟩/‖g_fp32‖² − 1
(the paper's multiplicative bias ĝ = (1+ζ)·g, projected on g).
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
from torch import nn

from models.train import Batch, Replica, Trainer, lr_at

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
        prefix = "paired/" if key == "all" else f"paired/{key}/"
        values[prefix + "grad_cos"] = dot / max((fp_sq * mx_sq) ** 0.5, 1e-300)
        values[prefix + "grad_rel_err"] = diff_sq / max(fp_sq, 1e-300)
        values[prefix + "grad_zeta"] = dot / max(fp_sq, 1e-300) - 1.0
    return values


class PairedTrainer(Trainer):
    """A Trainer whose step also trains an FP32 twin and compares the two gradients."""

    twin: Replica

    def _quantized(self, model: nn.Module) -> nn.Module:
        # mx.apply shares the Parameter objects, so the twin must be copied before it.
        # The twin is the FP32 reference: no autocast, fp32 weights, whatever train says.
        self.twin = Replica(
            copy.deepcopy(model), self.cfg, self.device, autocast="none", param_dtype="fp32"
        )
        return super()._quantized(model)

    def _before_update(self, batch: Batch, log: bool) -> dict[str, float]:
        twin_loss = self.twin.forward_backward(batch)
        values = gradient_bias(self.model, self.twin.model) if log else {}
        if log:
            values["paired/fp32_loss"] = twin_loss.item()
        self.twin.update(lr_at(self.step, self.cfg))
        return values

    def _record_val(self) -> dict[str, float]:
        values = super()._record_val()
        values["paired/fp32_val_loss"] = self.twin.mean_loss(self.data.val_batches())
        return values

    def state_dict(self, attempt_start: float) -> dict[str, Any]:
        twin = self.twin.state()
        return {
            **super().state_dict(attempt_start),
            "twin_model": twin["model"],
            "twin_optimizer": twin["optimizer"],
        }

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.twin.load_state({"model": state["twin_model"], "optimizer": state["twin_optimizer"]})
