"""One training run: a grid point trained to its step count, recorded and resumable.

Metric rows are buffered in memory and written only together with a checkpoint (part
first, then the checkpoint that counts it). A resume drops any part the checkpoint does
not count and recomputes those steps, so rows are never lost or duplicated. Batches are a
pure function of (seed, step) and the schedule a pure function of step, so the
checkpointed step is the whole data and scheduler position.

Under several processes (models.distributed) every rank builds the same global batch and
trains on its slice; collectives keep losses, stop requests and divergence decisions the
same on every rank, and only rank 0 writes metric parts and checkpoints.

The parts, each in its own module: the workload (models.workloads, by ``model.kind``), the
replica (models.replica: device, precision, DDP/FSDP, autocast), the schedule
(models.schedule), the tracker and divergence rule (models.tracker), stop signals
(models.signals), the diagnostic probes (models.probes), the summary (models.summary).
A paired run's FP32 twin (models.paired) and a branch's start state (models.branch) are
given by models.runner.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from models.checkpoint import finite_state, load_latest, save_checkpoint
from models.config import RunSpec, TrainConfig
from models.distributed import current_world, resolve_strategy
from models.dtypes import resolve_autocast, resolve_param_dtype
from models.flops import training_flops
from models.lotion import make_lotion
from models.metrics import MetricsWriter, drop_parts_from
from models.paired import FP32Twin
from models.probes import Step, layer_norm_names, probes_for
from models.replica import Replica, apply_precision, device_for, to_device
from models.schedule import lr_at
from models.signals import Preempted, StopSignals
from models.summary import run_summary
from models.tracker import Tracker
from models.transformer import count_params
from models.workloads import workload_for
from runfolder.metrics import TRAIN_LOSS, TRAIN_LR, VAL_LOSS
from runfolder.paths import RunPaths

__all__ = ["Preempted", "Reporter", "Trainer", "lr_at"]

# Builds a paired run's twin from the initial (unquantized) network.
TwinFactory = Callable[[nn.Module, TrainConfig, torch.device], FP32Twin]


class Reporter(Protocol):
    """Receives progress at every train-loss log step (the runner's heartbeat)."""

    def progress(self, step: int, total_steps: int, loss: float | None) -> None: ...


class _RankMetrics(MetricsWriter):
    """Ranks other than 0 compute every metric (that takes collectives) but write none."""

    def log(self, step: int, tokens: int, flops: float, values: dict[str, float]) -> None:
        pass

    def flush(self) -> None:
        return None


class Trainer:
    """Model, optimizer and bookkeeping of one run; ``run`` trains to the end. ``twin``
    builds the FP32 twin of a paired run."""

    def __init__(
        self,
        spec: RunSpec,
        run_dir: Path,
        reporter: Reporter | None,
        twin: TwinFactory | None = None,
    ) -> None:
        self.spec, self.cfg, self.reporter = spec, spec.train, reporter
        self.run_dir = Path(run_dir)
        paths = RunPaths(self.run_dir)
        self.ckpt_dir, self.metrics_dir = paths.checkpoints, paths.metrics
        torch.set_num_threads(self.cfg.threads or 1)
        self.world = current_world()
        self.device = device_for(self.cfg.device, self.world)
        self.workload = workload_for(spec.model.kind)
        torch.manual_seed(spec.seed)
        model, self.data = self.workload.build(spec, self.device)
        layer_norms = layer_norm_names(model)
        # Copied from the initial weights before mx.apply swaps the modules.
        self.twin = None if twin is None else twin(model, self.cfg, self.device)
        quantized, self.mx = apply_precision(model, spec)
        self.autocast, self.param_dtype = (
            resolve_autocast(spec, self.device),
            resolve_param_dtype(spec),
        )
        strategy = resolve_strategy(spec.resources.strategy, count_params(model))
        self.main = Replica(
            quantized, self.cfg, self.device, self.world, strategy, self.autocast, self.param_dtype
        )
        self.model = self.main.model
        self.n_params = count_params(self.model)
        self.lotion = make_lotion(self.cfg.lotion, spec.seed)
        self.probes = probes_for(self, layer_norms)
        self.eval_every = self.cfg.eval_every or max(1, self.cfg.steps // 10)
        self.ckpt_every = self.cfg.checkpoint_every or self.eval_every
        self.step, self.tracker = 0, Tracker()
        writer = MetricsWriter if self.world.is_main else _RankMetrics
        self.writer = writer(self.metrics_dir, spec.run_id)

    def resume(self, initial: Callable[[], dict[str, Any]] | None = None) -> Trainer:
        """Load the newest own checkpoint, else ``initial()`` when given (a branch's start
        state, models.branch.BranchStart); drop metric parts no checkpoint counts."""
        state = load_latest(self.ckpt_dir)
        if state is None and initial is not None:
            state = initial()
        if state is not None:
            self.load_state(state)
        if self.world.is_main:
            drop_parts_from(self.metrics_dir, self.writer.next_part)
        return self

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore everything ``state_dict`` saved."""
        self.main.load_state(state)
        torch.set_rng_state(state["rng"])
        self.step, self.tracker = state["step"], Tracker(**state["tracker"])
        self.writer.next_part = state["n_parts"]
        # A branch whose arm drops stochastic rounding has no stream to continue.
        if "mx_rounding" in state and self.mx is not None and self.spec.precision.stochastic:
            self.mx.load_rounding_state(self.model, state["mx_rounding"])
        if self.twin is not None:
            self.twin.load_state(state)
        if self.lotion is not None:
            self.lotion.load_state_dict(state.get("lotion_rounding"))

    def state_dict(self, attempt_start: float) -> dict[str, Any]:
        """The whole training position: weights, optimizer, RNG, step, tracker, parts."""
        tracker = asdict(self.tracker)
        tracker["wall_time_s"] += time.time() - attempt_start
        state = {
            "step": self.step,
            **self.main.state(),
            "rng": torch.get_rng_state(),
            "tracker": tracker,
            "n_parts": self.writer.next_part,
        }
        rounding = None if self.mx is None else self.mx.rounding_state(self.model)
        if rounding is not None:
            state["mx_rounding"] = rounding  # the stochastic-rounding stream position
        if self.twin is not None:
            state.update(self.twin.state())
        if self.lotion is not None and self.lotion.state_dict() is not None:
            state["lotion_rounding"] = self.lotion.state_dict()  # Monte-Carlo LOTION's
        return state

    def _checkpoint(self, attempt_start: float) -> None:
        self.writer.flush()
        # Every rank builds the state (gathering shards is collective); rank 0 writes it.
        state = self.state_dict(attempt_start)
        if self.world.is_main:
            if not finite_state(state):
                # A diverged run keeps its last finite checkpoint; resuming never loads NaNs.
                print(f"step {self.step}: non-finite state, not checkpointed", flush=True)
                return
            save_checkpoint(
                self.ckpt_dir, self.step, state, keep_every=self.cfg.keep_checkpoints_every
            )

    def val_loss(self) -> float:
        """Mean loss over the fixed validation batches."""
        return self.main.mean_loss(self.data.val_batches())

    def train_step(self, stats: bool, log: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
        """One optimizer update on the batch of the current step (the caller advances
        ``self.step``); returns the loss tensor and the probes' values (stats and log
        steps)."""
        return self._train_step(Step(self.step, stats, log))

    def _train_step(self, step: Step) -> tuple[torch.Tensor, dict[str, float]]:
        batch = to_device(self.world.shard(self.data.train_batch(step.index)), self.device)
        lr = lr_at(step.index, self.cfg)
        self.probes.run("before_forward", self, step)
        with self.lotion.sampled_weights(self.model) if self.lotion else contextlib.nullcontext():
            loss = self.main.forward_backward(batch)
        values = self.probes.run("after_backward", self, step)
        if self.lotion is not None:
            self.lotion.add_gradient(self.main)
        if self.twin is not None:
            self.twin.forward_backward(batch)
        values.update(self.probes.run("before_update", self, step))
        if self.twin is not None:
            self.twin.update(lr)
        step.grad_norm = self.main.update(lr)
        values.update(self.probes.run("after_update", self, step))
        return loss, values

    def run(self, until: int | None = None) -> dict:
        """Train from the current step to the end (or divergence, or update ``until``, where
        a checkpoint is written); return the summary."""
        cfg, start = self.cfg, time.time()
        last = min(cfg.steps, until or cfg.steps)
        tokens_per_step = self.spec.tokens_per_step
        self.probes.begin(self)
        with StopSignals() as stop:
            while not self.tracker.finished and self.step < last:
                update = self.step + 1
                stats = update % cfg.stats_every == 0
                log = update == 1 or update % cfg.log_every == 0 or update == cfg.steps
                step = Step(self.step, stats, log)
                loss, values = self._train_step(step)
                self.step = update
                if log:
                    loss_value = self.world.mean(loss).item()
                    values.update({TRAIN_LOSS: loss_value, TRAIN_LR: lr_at(update - 1, cfg)})
                    self.tracker.observe(update, loss_value, cfg.divergence_window)
                    if self.reporter is not None:
                        self.reporter.progress(update, cfg.steps, loss_value)
                values.update(self.probes.run("after_step", self, step))
                ending = update == cfg.steps or self.tracker.diverged_step is not None
                if update % self.eval_every == 0 or ending:
                    values.update(self._evaluate())
                tokens = update * tokens_per_step
                self.writer.log(update, tokens, training_flops(self.n_params, tokens), values)
                if self.tracker.diverged_step is not None:
                    break
                stopping = self.world.any(stop.received is not None)
                if update % self.ckpt_every == 0 or stopping or update == until:
                    self._checkpoint(start)
                if stopping:
                    signal_name = stop.received or "to another rank"
                    raise Preempted(
                        f"signal {signal_name} at step {update}; checkpoint written", update
                    )
            done = self.step == cfg.steps or self.tracker.diverged_step is not None
            if done and not self.tracker.finished:
                self.tracker.finished = True
                self._checkpoint(start)
                self.tracker.wall_time_s += time.time() - start
        return self.summary()

    def _evaluate(self) -> dict[str, float]:
        loss = self.val_loss()
        self.tracker.val_losses.append(loss)
        return {VAL_LOSS: loss, **self.probes.evaluate(self)}

    def summary(self) -> dict:
        """The flat, JSON-able run summary."""
        return run_summary(
            self.spec,
            self.tracker,
            steps_done=self.step,
            n_params=self.n_params,
            workload=self.workload,
            data=self.data,
            autocast=self.autocast,
            param_dtype=self.param_dtype,
        )
