"""One training run: a grid point trained to its step count, recorded and resumable.

Metric rows are buffered in memory and written only together with a checkpoint (part
first, then the checkpoint that counts it). A resume drops any part the checkpoint does
not count and recomputes those steps, so rows are never lost or duplicated. Batches are a
pure function of (seed, step) and the schedule a pure function of step, so the
checkpointed step is the whole data and scheduler position.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from models.checkpoint import load_latest, save_checkpoint
from models.config import RunSpec, TrainConfig
from models.data import DataSource, build_data
from models.flops import lm_attention_flops_per_token, training_flops
from models.metrics import MetricsWriter, drop_parts_from
from models.transformer import TransformerLM, count_params

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
    warmup_frac·steps, then cosine decay to final_lr_frac·lr at the last step."""
    warmup = round(cfg.warmup_frac * cfg.steps)
    if step < warmup:
        frac = cfg.warmup_init_frac + (1 - cfg.warmup_init_frac) * step / warmup
        return cfg.lr * frac
    progress = (step - warmup) / max(1, cfg.steps - 1 - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.final_lr_frac + (1 - cfg.final_lr_frac) * cosine)


@dataclass
class Tracker:
    """Run-level facts carried across resumes inside each checkpoint."""

    initial_loss: float | None = None
    last_train_loss: float | None = None
    val_losses: list[float] = field(default_factory=list)
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
    """Turns SIGTERM/SIGUSR2 into a flag the loop checks between steps."""

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

    def __exit__(self, *exc: object) -> None:
        # After a stop request the process is on its way out; SLURM signals the step and
        # the array task forwards the signal too, and that second copy must not kill it.
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if self.received is not None else handler)


def _device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device='cuda' but no CUDA device is available")
    return torch.device(name)


class Trainer:
    """Model, optimizer and bookkeeping of one run; ``run`` trains to the end."""

    def __init__(self, spec: RunSpec, run_dir: Path, reporter: Reporter | None) -> None:
        self.spec, self.cfg, self.reporter = spec, spec.train, reporter
        self.run_dir = Path(run_dir)
        self.ckpt_dir, self.metrics_dir = self.run_dir / "checkpoints", self.run_dir / "metrics"
        torch.set_num_threads(self.cfg.threads or 1)
        self.device = _device(self.cfg.device)
        self.data: DataSource = build_data(spec)
        torch.manual_seed(spec.seed)
        self.model = TransformerLM(spec.model)
        self.ln_modules = [n for n, m in self.model.named_modules() if isinstance(m, nn.LayerNorm)]
        self.mx = None
        if not spec.precision.is_noop:
            import mx
            from mx.fast import keep_freed_memory

            # Quantizer temporaries are large and short-lived: reusing freed memory avoids
            # a page fault per 4 KiB on every call (see mx.fast).
            keep_freed_memory()
            mx.apply(self.model, spec.precision)
            self.mx = mx
        self.model.to(self.device)
        self.n_params = count_params(self.model)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=self.cfg.lr,
            betas=(self.cfg.beta1, self.cfg.beta2),
            eps=self.cfg.eps,
            weight_decay=self.cfg.weight_decay,
            foreach=True,
        )
        self.micro = self.cfg.micro_batch_size or self.cfg.batch_size
        self.eval_every = self.cfg.eval_every or max(1, self.cfg.steps // 10)
        self.ckpt_every = self.cfg.checkpoint_every or self.eval_every
        self.autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if self.device.type == "cuda"
            else contextlib.nullcontext()
        )
        self.step, self.tracker = 0, Tracker()
        self.writer = MetricsWriter(self.metrics_dir, spec.run_id)
        self._resume()

    def _resume(self) -> None:
        state = load_latest(self.ckpt_dir)
        if state is not None:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"])
            self.step, self.tracker = state["step"], Tracker(**state["tracker"])
            self.writer.next_part = state["n_parts"]
        drop_parts_from(self.metrics_dir, self.writer.next_part)

    def _checkpoint(self, attempt_start: float) -> None:
        self.writer.flush()
        tracker = asdict(self.tracker)
        tracker["wall_time_s"] += time.time() - attempt_start
        save_checkpoint(
            self.ckpt_dir,
            self.step,
            {
                "step": self.step,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "rng": torch.get_rng_state(),
                "tracker": tracker,
                "n_parts": self.writer.next_part,
            },
        )

    def _forward_backward(self, batch: torch.Tensor) -> torch.Tensor:
        chunks = batch.split(self.micro)
        total = torch.zeros((), device=self.device)
        for chunk in chunks:
            with self.autocast:
                loss = self.model.loss(chunk) / len(chunks)
            loss.backward()
            total += loss.detach()
        return total

    @torch.no_grad()
    def val_loss(self) -> float:
        """Mean loss over the fixed validation batches."""
        self.model.eval()
        losses = []
        for batch in self.data.val_batches():
            for chunk in torch.from_numpy(batch).to(self.device).split(self.micro):
                with self.autocast:
                    losses.append(self.model.loss(chunk).float())
        self.model.train()
        return torch.stack(losses).mean().item()

    def _stats(self, grad_norms: list[float]) -> dict[str, float]:
        params = [(n, p) for n, p in self.model.named_parameters()]
        values = {f"grad_norm/{n}": g for (n, _), g in zip(params, grad_norms, strict=True)}
        param_norms = torch.stack([p.detach().norm() for _, p in params]).tolist()
        values.update({f"param_norm/{n}": v for (n, _), v in zip(params, param_norms, strict=True)})
        for name in self.ln_modules:
            weight = self.model.get_submodule(name).weight.detach().float()
            values[f"ln/{name}/weight_mean"] = weight.mean().item()
            values[f"ln/{name}/weight_std"] = weight.std().item()
            values[f"ln/{name}/weight_max"] = weight.max().item()
        return values

    def train_step(self, stats: bool) -> tuple[torch.Tensor, dict[str, float]]:
        """One optimizer update on the batch of the current step (the caller advances
        ``self.step``); returns the loss tensor and, on stats steps, the stats values."""
        batch = torch.from_numpy(self.data.train_batch(self.step)).to(self.device)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.step, self.cfg)
        if stats and self.mx is not None:
            self.mx.set_clip_tracking(self.model, True)
        loss = self._forward_backward(batch)
        values: dict[str, float] = {}
        if stats:
            if self.mx is not None:
                # clip_rates must be read before tracking is switched off (that clears them).
                values = {f"mx/clip/{k}": v for k, v in self.mx.clip_rates(self.model).items()}
                self.mx.set_clip_tracking(self.model, False)
            grads = [p.grad for p in self.model.parameters()]
            grad_norms = torch.stack([g.norm() for g in grads]).tolist()
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        total_norm = nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if stats:
            values.update({"optim/grad_norm": total_norm.item(), **self._stats(grad_norms)})
        return loss, values

    def run(self) -> dict:
        """Train from the current step to the end (or divergence); return the summary."""
        cfg, start = self.cfg, time.time()
        tokens_per_step = self.spec.tokens_per_step
        perf_mark = (start, self.step)
        with _StopSignals() as stop:
            while not self.tracker.finished and self.step < cfg.steps:
                update = self.step + 1
                stats = update % cfg.stats_every == 0
                loss, values = self.train_step(stats)
                self.step = update
                if update == 1 or update % cfg.log_every == 0 or update == cfg.steps:
                    loss_value = loss.item()
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
                    values["val/loss"] = self._record_val()
                tokens = update * tokens_per_step
                self.writer.log(update, tokens, training_flops(self.n_params, tokens), values)
                if self.tracker.diverged_step is not None:
                    break
                if update % self.ckpt_every == 0 or stop.received is not None:
                    self._checkpoint(start)
                if stop.received is not None:
                    raise Preempted(
                        f"signal {stop.received} at step {update}; checkpoint written", update
                    )
            if not self.tracker.finished:
                self.tracker.finished = True
                self._checkpoint(start)
                self.tracker.wall_time_s += time.time() - start
        return self.summary()

    def _record_val(self) -> float:
        loss = self.val_loss()
        self.tracker.val_losses.append(loss)
        return loss

    def summary(self) -> dict:
        """The flat, JSON-able run summary."""
        spec, t = self.spec, self.tracker
        tokens = spec.train.steps * spec.tokens_per_step
        flops = training_flops(self.n_params, tokens)
        m = spec.model
        attn = lm_attention_flops_per_token(m.d_model, m.n_layers, m.seq_len) * tokens
        finite = [v for v in t.val_losses if math.isfinite(v)]
        return {
            "run_id": spec.run_id,
            "state": "done" if t.diverged_step is None else "diverged",
            "steps_done": self.step,
            "total_steps": spec.train.steps,
            "diverged_step": t.diverged_step,
            "final_val_loss": _finite(t.val_losses[-1] if t.val_losses else None),
            "min_val_loss": min(finite) if finite else None,
            "final_train_loss": _finite(t.last_train_loss),
            "initial_loss": _finite(t.initial_loss),
            "n_params": self.n_params,
            "tokens": tokens,
            "flops": flops,
            "flops_attn": flops + attn,
            "budget": spec.budget,
            "wall_time_s": t.wall_time_s,
            "entropy_rate": self.data.entropy_rate,
            "unigram_entropy": self.data.unigram_entropy(),
            "config": spec.tags.get("config", spec.precision.label),
            "w_fmt": spec.precision.w_fmt,
            "a_fmt": spec.precision.a_fmt,
            "d_model": m.d_model,
            "n_layers": m.n_layers,
            "seed": spec.seed,
        }


def _finite(value: float | None) -> float | None:
    """JSON has no NaN/Inf: non-finite losses of a diverged run become None."""
    return value if value is not None and math.isfinite(value) else None


def train_run(spec: RunSpec, run_dir: Path, reporter: Reporter | None = None) -> dict:
    """Train (resuming from run_dir/checkpoints if present); return the summary dict."""
    return Trainer(spec, run_dir, reporter).run()
