"""One training run: a grid point trained to its step count, recorded and resumable.

Metric rows are buffered in memory and written only together with a checkpoint (part
first, then the checkpoint that counts it). A resume drops any part the checkpoint does
not count and recomputes those steps, so rows are never lost or duplicated. Batches are a
pure function of (seed, step) and the schedule a pure function of step, so the
checkpointed step is the whole data and scheduler position.

Under several processes (models.distributed) every rank builds the same global batch and
trains on its slice; collectives keep losses, stop requests and divergence decisions the
same on every rank, and only rank 0 writes metric parts and checkpoints.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from models.checkpoint import finite_state, load_latest, save_checkpoint
from models.config import LMConfig, ProxyConfig, RunSpec, TrainConfig
from models.data import build_data
from models.distributed import (
    World,
    cuda_device,
    current_world,
    full,
    full_state,
    is_sharded,
    load_full_state,
    local_gradients,
    parallelize,
    resolve_strategy,
)
from models.dtypes import (
    Autocast,
    ParamDtype,
    autocast_context,
    resolve_autocast,
    resolve_param_dtype,
    torch_dtype,
)
from models.flops import lm_attention_flops_per_token, training_flops
from models.metrics import MetricsWriter, drop_parts_from
from models.transformer import TransformerLM, count_params
from mx.spec import MX_FORMATS

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


class Reporter(Protocol):
    """Receives progress at every train-loss log step (the runner's heartbeat)."""

    def progress(self, step: int, total_steps: int, loss: float | None) -> None: ...


class Preempted(Exception):  # noqa: N818 - the name is the runner's contract
    """Raised after a checkpoint was written because SIGTERM/SIGUSR2 arrived."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


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


@dataclass
class Tracker:
    """Run-level facts carried across resumes inside each checkpoint."""

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


class _StopSignals:
    """Turns SIGTERM/SIGUSR2 into a flag the loop checks between steps (the ranks of a
    multi-process run agree on it, so they all stop after the same step)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        # Signal handlers can only be installed from the main thread (Ray may use others).
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signum

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        # After a stop request the process is on its way out; SLURM signals the step and
        # the array task forwards the signal too, and that second copy must not kill it
        # (nor a copy that reaches a rank which learnt of the stop from another rank).
        stopping = self.received is not None or exc_type is Preempted
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if stopping else handler)


def _device(name: str, world: World) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device='cuda' but no CUDA device is available")
    if name == "cuda" and world.size > 1:
        return cuda_device(world)
    return torch.device(name)


Batch = torch.Tensor | tuple[torch.Tensor, ...]


def _to_device(batch: Any, device: torch.device) -> Batch:
    """A data source's batch (numpy tokens, a tensor or a tuple of tensors) on ``device``."""
    if isinstance(batch, tuple):
        return tuple(_to_device(part, device) for part in batch)
    if not isinstance(batch, torch.Tensor):
        batch = torch.from_numpy(batch)
    return batch.to(device)


def _split(batch: Batch, size: int) -> list[Batch]:
    """Micro-batches of ``size`` samples along dim 0 (a tuple splits part by part)."""
    if isinstance(batch, tuple):
        return list(zip(*(part.split(size) for part in batch), strict=True))
    return list(batch.split(size))


def build_workload(spec: RunSpec, device: torch.device) -> tuple[nn.Module, Any]:
    """The network (seeded by ``spec.seed``, unquantized) and the data source of a run."""
    torch.manual_seed(spec.seed)
    if isinstance(spec.model, ProxyConfig):
        from models.proxy import Student, TeacherData

        data = TeacherData(
            spec.model,
            batch_size=spec.train.batch_size,
            eval_batches=spec.train.eval_batches,
            seed=spec.seed,
            device=device,
            precision=spec.precision,
        )
        torch.manual_seed(spec.seed)
        return Student(spec.model), data
    return TransformerLM(spec.model), build_data(spec)


class Replica:
    """One network and its optimizer: forward/backward over micro-batches, then an update.

    Across several ranks each one holds a DDP replica or an FSDP shard of the network and
    passes its own slice of every batch; gradients and losses are averaged over the ranks.
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        device: torch.device,
        world: World | None = None,
        strategy: str = "ddp",
        autocast: Autocast = "none",
        param_dtype: ParamDtype = "fp32",
    ) -> None:
        self.model, self.cfg, self.device = model.to(device), cfg, device
        self.world = world or World()
        self.net = parallelize(self.model, self.world, strategy, device, torch_dtype(param_dtype))
        # Built after sharding: FSDP replaces the parameters by their shards.
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.lr,
            betas=(cfg.beta1, cfg.beta2),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            foreach=True,
        )
        self.micro = cfg.micro_batch_size or cfg.batch_size
        self.autocast = autocast_context(autocast, device)

    def forward_backward(self, batch: Batch) -> torch.Tensor:
        """Accumulate the gradient of the mean loss over ``batch`` (this rank's slice; the
        gradient is averaged over ranks); return this rank's loss."""
        chunks = _split(batch, self.micro)
        total = torch.zeros((), device=self.device)
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            with contextlib.nullcontext() if last else local_gradients(self.net):
                with self.autocast:
                    loss = self.net(chunk) / len(chunks)
                loss.backward()
            total += loss.detach()
        return total

    def update(self, lr: float) -> torch.Tensor:
        """Clip, step and zero the gradients; return the pre-clip gradient norm."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        total_norm = full(nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total_norm

    @torch.no_grad()
    def mean_loss(self, batches: list[Any]) -> float:
        """Mean loss over fixed (global) batches in eval mode, averaged over the ranks."""
        self.net.eval()
        losses = []
        for batch in batches:
            for chunk in _split(_to_device(self.world.shard(batch), self.device), self.micro):
                with self.autocast:
                    losses.append(self.net(chunk).float())
        self.net.train()
        return self.world.mean_in_order(torch.stack(losses).view(len(batches), -1)).item()

    def state(self) -> dict[str, Any]:
        """Model and optimizer state in the single-process layout (a sharded network is
        gathered into rank 0: every rank must call this)."""
        if is_sharded(self.net):
            return full_state(self.model, self.optimizer)
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        if is_sharded(self.net):
            load_full_state(self.model, self.optimizer, state)
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class _RankMetrics(MetricsWriter):
    """Ranks other than 0 compute every metric (that takes collectives) but write none."""

    def log(self, step: int, tokens: int, flops: float, values: dict[str, float]) -> None:
        pass

    def flush(self) -> None:
        return None


class Trainer:
    """Model, optimizer and bookkeeping of one run; ``run`` trains to the end."""

    def __init__(self, spec: RunSpec, run_dir: Path, reporter: Reporter | None) -> None:
        self.spec, self.cfg, self.reporter = spec, spec.train, reporter
        self.run_dir = Path(run_dir)
        self.ckpt_dir, self.metrics_dir = self.run_dir / "checkpoints", self.run_dir / "metrics"
        torch.set_num_threads(self.cfg.threads or 1)
        self.world = current_world()
        self.device = _device(self.cfg.device, self.world)
        model, self.data = build_workload(spec, self.device)
        self.ln_modules = [n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
        self.mx = None
        strategy = resolve_strategy(spec.resources.strategy, count_params(model))
        self.autocast = resolve_autocast(spec, self.device)
        self.param_dtype = resolve_param_dtype(spec)
        self.main = Replica(
            self._quantized(model),
            self.cfg,
            self.device,
            self.world,
            strategy,
            autocast=self.autocast,
            param_dtype=self.param_dtype,
        )
        self.model = self.main.model
        self.n_params = count_params(self.model)
        self.eval_every = self.cfg.eval_every or max(1, self.cfg.steps // 10)
        self.ckpt_every = self.cfg.checkpoint_every or self.eval_every
        self.step, self.tracker = 0, Tracker()
        writer = MetricsWriter if self.world.is_main else _RankMetrics
        self.writer = writer(self.metrics_dir, spec.run_id)

    def _quantized(self, model: nn.Module) -> nn.Module:
        """``model`` with the run's precision applied in place (unchanged for pure fp32)."""
        if self.spec.precision.is_noop:
            return model
        import mx
        from mx.fast import keep_freed_memory

        # Quantizer temporaries are large and short-lived: reusing freed memory avoids a
        # page fault per 4 KiB on every call (see mx.fast).
        keep_freed_memory()
        self.mx = mx
        return mx.apply(model, self.spec.precision, seed=self.spec.seed)

    def resume(self, initial: Callable[[], dict[str, Any]] | None = None) -> Trainer:
        """Load the newest own checkpoint, else ``initial()`` when given (a branch's start
        state); drop metric parts no checkpoint counts."""
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

    def _stats(self, grad_norms: list[float]) -> dict[str, float]:
        params = [(n, p) for n, p in self.model.named_parameters()]
        values = {f"grad_norm/{n}": g for (n, _), g in zip(params, grad_norms, strict=True)}
        param_norms = torch.stack([full(p.detach().norm()) for _, p in params]).tolist()
        values.update({f"param_norm/{n}": v for (n, _), v in zip(params, param_norms, strict=True)})
        for name in self.ln_modules:
            values.update(self._ln_stats(name, self.model.get_submodule(name)))
        return values

    def _ln_stats(self, name: str, ln: nn.LayerNorm) -> dict[str, float]:
        """Affine weight/bias statistics, and the weight's clip rate as if it sat in MX
        blocks of the weight format (the paper's diagnostic, whatever ``ln`` says)."""
        values: dict[str, float] = {}
        for role in ("weight", "bias"):
            param = getattr(ln, role)
            if param is None:
                continue
            param = full(param.detach()).float()
            values[f"ln/{name}/{role}_mean"] = param.mean().item()
            values[f"ln/{name}/{role}_std"] = param.std().item()
            values[f"ln/{name}/{role}_max"] = param.max().item()
        w_fmt = self.spec.precision.w_fmt
        if self.mx is not None and ln.weight is not None and w_fmt in MX_FORMATS:
            spec = self.spec.precision
            values[f"ln/{name}/weight_clip"] = self.mx.clip_rate(
                full(ln.weight.detach()),
                w_fmt,
                block_size=spec.block_size,
                scale_rule=spec.scale_rule,
            )
        return values

    def train_step(self, stats: bool, log: bool = False) -> tuple[torch.Tensor, dict[str, float]]:
        """One optimizer update on the batch of the current step (the caller advances
        ``self.step``); returns the loss tensor and, on stats steps, the stats values.
        ``log`` says the loss will be logged (subclasses add per-log-step metrics)."""
        batch = _to_device(self.world.shard(self.data.train_batch(self.step)), self.device)
        if stats and self.mx is not None:
            self.mx.set_clip_tracking(self.model, True)
        loss = self.main.forward_backward(batch)
        values: dict[str, float] = {}
        if stats:
            if self.mx is not None:
                # clip_rates must be read before tracking is switched off (that clears them).
                rates = {f"mx/clip/{k}": v for k, v in self.mx.clip_rates(self.model).items()}
                values = self.world.mean_values(rates)
                self.mx.set_clip_tracking(self.model, False)
            grads = [p.grad for p in self.model.parameters()]
            grad_norms = torch.stack([full(g.norm()) for g in grads]).tolist()
        if self.cfg.lotion is not None:
            values.update(self._lotion(log))
        values.update(self._before_update(batch, log))
        total_norm = self.main.update(lr_at(self.step, self.cfg))
        if stats:
            values.update({"optim/grad_norm": total_norm.item(), **self._stats(grad_norms)})
        return loss, values

    def _lotion(self, log: bool) -> dict[str, float]:
        """Add the gradient of LOTION's smoothing term (see models.lotion)."""
        from models.lotion import lotion_penalty

        cfg = self.cfg.lotion
        penalty = lotion_penalty(self.model, self.main.optimizer, cfg.fmt, cfg.strength)
        if penalty.requires_grad:
            penalty.backward()
        return {"lotion/penalty": penalty.item()} if log else {}

    def _before_update(self, batch: Batch, log: bool) -> dict[str, float]:
        """Hook between the backward pass and the update (paired training uses it)."""
        return {}

    def run(self, until: int | None = None) -> dict:
        """Train from the current step to the end (or divergence, or update ``until``, where
        a checkpoint is written); return the summary."""
        cfg, start = self.cfg, time.time()
        last = min(cfg.steps, until or cfg.steps)
        tokens_per_step = self.spec.tokens_per_step
        perf_mark = (start, self.step)
        with _StopSignals() as stop:
            while not self.tracker.finished and self.step < last:
                update = self.step + 1
                stats = update % cfg.stats_every == 0
                log = update == 1 or update % cfg.log_every == 0 or update == cfg.steps
                loss, values = self.train_step(stats, log)
                self.step = update
                if log:
                    loss_value = self.world.mean(loss).item()
                    values.update({"train/loss": loss_value, "train/lr": lr_at(update - 1, cfg)})
                    self.tracker.observe(update, loss_value, cfg.divergence_window)
                    if self.reporter is not None:
                        self.reporter.progress(update, cfg.steps, loss_value)
                if stats:
                    now = time.time()
                    step_time = (now - perf_mark[0]) / (update - perf_mark[1])
                    values["perf/step_time"] = step_time
                    values["perf/tokens_per_s"] = tokens_per_step / step_time
                    perf_mark = (now, update)
                ending = update == cfg.steps or self.tracker.diverged_step is not None
                if update % self.eval_every == 0 or ending:
                    values.update(self._record_val())
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

    def _record_val(self) -> dict[str, float]:
        loss = self.val_loss()
        self.tracker.val_losses.append(loss)
        values = {"val/loss": loss}
        if self.cfg.quantized_eval is not None:
            from models.lotion import quantized_weights

            with quantized_weights(self.model, self.cfg.quantized_eval):
                values["val/loss_quantized"] = quantized = self.val_loss()
            self.tracker.val_losses_quantized.append(quantized)
        return values

    def summary(self) -> dict:
        """The flat, JSON-able run summary."""
        spec, t = self.spec, self.tracker
        tokens = spec.train.steps * spec.tokens_per_step
        flops = training_flops(self.n_params, tokens)
        m = spec.model
        attn = (
            lm_attention_flops_per_token(m.d_model, m.n_layers, m.seq_len) * tokens
            if isinstance(m, LMConfig)
            else 0.0
        )
        finite = [v for v in t.val_losses if math.isfinite(v)]
        branch = spec.branch
        return {
            "run_id": spec.run_id,
            "kind": m.kind,
            "state": "done" if t.diverged_step is None else "diverged",
            "steps_done": self.step,
            "total_steps": spec.train.steps,
            "diverged_step": t.diverged_step,
            "final_val_loss": _finite(t.val_losses[-1] if t.val_losses else None),
            "min_val_loss": min(finite) if finite else None,
            "final_val_loss_quantized": _finite(
                t.val_losses_quantized[-1] if t.val_losses_quantized else None
            ),
            "final_train_loss": _finite(t.last_train_loss),
            "initial_loss": _finite(t.initial_loss),
            "n_params": self.n_params,
            "tokens": tokens,
            "flops": flops,
            "flops_attn": flops + attn,
            "budget": spec.budget,
            "wall_time_s": t.wall_time_s,
            # Measured over every attempt's training time (evaluation included).
            "tokens_per_s": (self.step - (branch.step if branch else 0))
            * spec.tokens_per_step
            / t.wall_time_s
            if t.wall_time_s > 0
            else None,
            "entropy_rate": self.data.entropy_rate,
            "unigram_entropy": self.data.unigram_entropy(),
            "config": spec.label,
            "w_fmt": spec.precision.w_fmt,
            "a_fmt": spec.precision.a_fmt,
            "d_model": m.d_model,
            "n_layers": m.n_layers,
            "lr": spec.train.lr,
            "seed": spec.seed,
            "parent": branch.parent if branch else None,
            "branch_step": branch.step if branch else None,
            "arm": branch.arm if branch else None,
            "autocast": self.autocast,
            "param_dtype": self.param_dtype,
        }


def _finite(value: float | None) -> float | None:
    """JSON has no NaN/Inf: non-finite losses of a diverged run become None."""
    return value if value is not None and math.isfinite(value) else None
