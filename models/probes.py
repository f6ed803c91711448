"""Diagnostic probes: every metric a run logs besides train/loss, train/lr and val/loss.

A probe is the names it logs (``names``; ``x/*`` stands for a family), when it runs
(``every``: stats steps, log steps or evaluations) and how it computes them: it overrides
the hooks of the moments it needs, each returning ``{name: value}``. The trainer calls the
hooks in the order of a step, and the values keep that order in the metric rows:

    before_forward, (forward/backward), after_backward, (extra gradient terms, the twin's
    backward), before_update, (update), after_update, (train/loss), after_step

and ``on_eval`` after val/loss. Probes observe and never change what is trained. Adding a
metric: a probe class here and a line in ``probes_for``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from models.distributed import full
from models.paired import gradient_bias
from mx.spec import MX_FORMATS
from runfolder.metrics import (
    GRAD_NORM,
    GRAD_NORM_PREFIX,
    LOTION_PENALTY,
    MX_CLIP_PREFIX,
    PAIRED_FP32_LOSS,
    PAIRED_FP32_VAL_LOSS,
    PAIRED_PREFIX,
    STEP_TIME,
    TOKENS_PER_S,
    VAL_LOSS_QUANTIZED,
)

if TYPE_CHECKING:
    from models.train import Trainer

Values = dict[str, float]


@dataclass
class Step:
    """The update being made: its 0-based index, whether it is a stats and/or a log step,
    and (from ``after_update`` on) the pre-clip gradient norm the update returned."""

    index: int
    stats: bool
    log: bool
    grad_norm: torch.Tensor | None = None


class Probe:
    """Base class: hooks that log nothing."""

    names: tuple[str, ...] = ()
    every: Literal["stats", "log", "eval"] = "stats"

    def due(self, step: Step) -> bool:
        """Whether the probe runs at ``step`` (an eval probe runs only in ``on_eval``)."""
        return step.stats if self.every == "stats" else self.every == "log" and step.log

    def begin(self, trainer: Trainer) -> None:
        """Called when ``Trainer.run`` starts (every attempt)."""

    def before_forward(self, trainer: Trainer, step: Step) -> Values:
        return {}

    def after_backward(self, trainer: Trainer, step: Step) -> Values:
        return {}

    def before_update(self, trainer: Trainer, step: Step) -> Values:
        return {}

    def after_update(self, trainer: Trainer, step: Step) -> Values:
        return {}

    def after_step(self, trainer: Trainer, step: Step) -> Values:
        return {}

    def on_eval(self, trainer: Trainer) -> Values:
        return {}


HOOKS = ("before_forward", "after_backward", "before_update", "after_update", "after_step")


class Probes:
    """The run's probes, called in their list order at each moment."""

    def __init__(self, probes: Iterable[Probe]) -> None:
        self.probes = list(probes)

    def begin(self, trainer: Trainer) -> None:
        for probe in self.probes:
            probe.begin(trainer)

    def run(self, hook: str, trainer: Trainer, step: Step) -> Values:
        """The values of every probe due at ``step`` for moment ``hook`` (one of HOOKS)."""
        values: Values = {}
        for probe in self.probes:
            if probe.due(step):
                values.update(getattr(probe, hook)(trainer, step))
        return values

    def evaluate(self, trainer: Trainer) -> Values:
        """The eval probes' values (after val/loss)."""
        values: Values = {}
        for probe in self.probes:
            if probe.every == "eval":
                values.update(probe.on_eval(trainer))
        return values

    @property
    def names(self) -> tuple[str, ...]:
        """Every name (or ``x/*`` family) these probes may log."""
        return tuple(name for probe in self.probes for name in probe.names)


class ClipRates(Probe):
    """Per-layer MX clip rates of the stats step's forward (weights ``/w``, activations
    ``/a``), averaged over the ranks."""

    names = (f"{MX_CLIP_PREFIX}*",)

    def before_forward(self, trainer: Trainer, step: Step) -> Values:
        trainer.mx.set_clip_tracking(trainer.model, True)
        return {}

    def after_backward(self, trainer: Trainer, step: Step) -> Values:
        # clip_rates must be read before tracking is switched off (that clears them).
        rates = {MX_CLIP_PREFIX + k: v for k, v in trainer.mx.clip_rates(trainer.model).items()}
        values = trainer.world.mean_values(rates)
        trainer.mx.set_clip_tracking(trainer.model, False)
        return values


class GradNorms(Probe):
    """The update's pre-clip gradient norm and every parameter's gradient norm (read before
    extra gradient terms such as LOTION's are added)."""

    names = (GRAD_NORM, f"{GRAD_NORM_PREFIX}*")

    def __init__(self) -> None:
        self._norms: list[float] = []

    def after_backward(self, trainer: Trainer, step: Step) -> Values:
        grads = [p.grad for p in trainer.model.parameters()]
        self._norms = torch.stack([full(g.norm()) for g in grads]).tolist()
        return {}

    def after_update(self, trainer: Trainer, step: Step) -> Values:
        names = [name for name, _ in trainer.model.named_parameters()]
        values = {GRAD_NORM: step.grad_norm.item()}
        values.update({GRAD_NORM_PREFIX + n: g for n, g in zip(names, self._norms, strict=True)})
        return values


class ParamNorms(Probe):
    """Every parameter's norm after the update."""

    names = ("param_norm/*",)

    def after_update(self, trainer: Trainer, step: Step) -> Values:
        params = list(trainer.model.named_parameters())
        norms = torch.stack([full(p.detach().norm()) for _, p in params]).tolist()
        return {f"param_norm/{n}": v for (n, _), v in zip(params, norms, strict=True)}


def layer_norm_names(model: nn.Module) -> list[str]:
    """Paths of the LayerNorms of an unquantized ``model`` (mx.apply may swap their type)."""
    return [name for name, module in model.named_modules() if isinstance(module, nn.LayerNorm)]


class LayerNormStats(Probe):
    """Affine weight/bias mean, std and max of every LayerNorm, and the weight's clip rate
    as if it sat in MX blocks of the weight format (the paper's diagnostic, whatever the
    LayerNorm's own precision says)."""

    names = ("ln/*",)

    def __init__(self, modules: list[str]) -> None:
        self.modules = modules

    def after_update(self, trainer: Trainer, step: Step) -> Values:
        values: Values = {}
        for name in self.modules:
            values.update(self._stats(trainer, name, trainer.model.get_submodule(name)))
        return values

    @staticmethod
    def _stats(trainer: Trainer, name: str, ln: nn.Module) -> Values:
        values: Values = {}
        for role in ("weight", "bias"):
            param = getattr(ln, role)
            if param is None:
                continue
            param = full(param.detach()).float()
            values[f"ln/{name}/{role}_mean"] = param.mean().item()
            values[f"ln/{name}/{role}_std"] = param.std().item()
            values[f"ln/{name}/{role}_max"] = param.max().item()
        precision = trainer.spec.precision
        if trainer.mx is not None and ln.weight is not None and precision.w_fmt in MX_FORMATS:
            values[f"ln/{name}/weight_clip"] = trainer.mx.clip_rate(
                full(ln.weight.detach()),
                precision.w_fmt,
                block_size=precision.block_size,
                scale_rule=precision.scale_rule,
            )
        return values


class LotionPenalty(Probe):
    """The value of LOTION's smoothing term at the log step (second-order form,
    models.lotion)."""

    names = (LOTION_PENALTY,)
    every = "log"

    def before_update(self, trainer: Trainer, step: Step) -> Values:
        return {LOTION_PENALTY: trainer.lotion.penalty.item()}


class PairedGradients(Probe):
    """Gradient agreement of the main network and its FP32 twin (models.paired), and the
    twin's loss on the same batch."""

    names = (f"{PAIRED_PREFIX}grad_*", f"{PAIRED_PREFIX}*/grad_*", PAIRED_FP32_LOSS)
    every = "log"

    def before_update(self, trainer: Trainer, step: Step) -> Values:
        values = gradient_bias(trainer.model, trainer.twin.model)
        values[PAIRED_FP32_LOSS] = trainer.twin.loss.item()
        return values


class PairedValLoss(Probe):
    """The FP32 twin's validation loss."""

    names = (PAIRED_FP32_VAL_LOSS,)
    every = "eval"

    def on_eval(self, trainer: Trainer) -> Values:
        return {PAIRED_FP32_VAL_LOSS: trainer.twin.val_loss(trainer.data.val_batches())}


class QuantizedEval(Probe):
    """Validation loss with the Linear weights cast to ``train.quantized_eval``; also kept in
    the tracker for the summary's ``final_val_loss_quantized``."""

    names = (VAL_LOSS_QUANTIZED,)
    every = "eval"

    def on_eval(self, trainer: Trainer) -> Values:
        from models.lotion import quantized_weights

        with quantized_weights(trainer.model, trainer.cfg.quantized_eval):
            loss = trainer.val_loss()
        trainer.tracker.val_losses_quantized.append(loss)
        return {VAL_LOSS_QUANTIZED: loss}


class Throughput(Probe):
    """Mean step time and tokens/s since the previous stats step (or the attempt's start)."""

    names = (STEP_TIME, TOKENS_PER_S)

    def begin(self, trainer: Trainer) -> None:
        self._mark = (time.time(), trainer.step)

    def after_step(self, trainer: Trainer, step: Step) -> Values:
        now, update = time.time(), step.index + 1
        step_time = (now - self._mark[0]) / (update - self._mark[1])
        self._mark = (now, update)
        return {
            STEP_TIME: step_time,
            TOKENS_PER_S: trainer.spec.tokens_per_step / step_time,
        }


def probes_for(trainer: Trainer, layer_norms: list[str]) -> Probes:
    """The probes of ``trainer``'s run, in the order their values are logged."""
    cfg = trainer.cfg
    probes: list[Probe] = []
    if trainer.mx is not None:
        probes.append(ClipRates())
    probes.append(GradNorms())
    if trainer.lotion is not None and trainer.lotion.form == "second_order":
        probes.append(LotionPenalty())
    if trainer.twin is not None:
        probes.append(PairedGradients())
    probes += [ParamNorms(), LayerNormStats(layer_norms), Throughput()]
    if cfg.quantized_eval is not None:
        probes.append(QuantizedEval())
    if trainer.twin is not None:
        probes.append(PairedValLoss())
    return Probes(probes)
