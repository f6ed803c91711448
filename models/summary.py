"""The flat, JSON-able summary of a run (``summary.json``), from its spec and tracker."""

from __future__ import annotations

import math

from models.config import RunSpec
from models.flops import training_flops
from models.tracker import Tracker
from models.workloads import DataSource, Workload


def run_summary(
    spec: RunSpec,
    tracker: Tracker,
    *,
    steps_done: int,
    n_params: int,
    workload: Workload,
    data: DataSource,
    autocast: str,
    param_dtype: str,
) -> dict:
    """The summary after ``steps_done`` updates of a run of ``workload`` (its FLOPs beyond
    6·N·D) over ``data`` (its entropy facts)."""
    t, m, branch = tracker, spec.model, spec.branch
    tokens = spec.train.steps * spec.tokens_per_step
    flops = training_flops(n_params, tokens)
    finite = [v for v in t.val_losses if math.isfinite(v)]
    return {
        "run_id": spec.run_id,
        "kind": m.kind,
        "state": "done" if t.diverged_step is None else "diverged",
        "steps_done": steps_done,
        "total_steps": spec.train.steps,
        "diverged_step": t.diverged_step,
        "final_val_loss": _finite(t.val_losses[-1] if t.val_losses else None),
        "min_val_loss": min(finite) if finite else None,
        "final_val_loss_quantized": _finite(
            t.val_losses_quantized[-1] if t.val_losses_quantized else None
        ),
        "final_train_loss": _finite(t.last_train_loss),
        "initial_loss": _finite(t.initial_loss),
        "n_params": n_params,
        "tokens": tokens,
        "flops": flops,
        "flops_attn": flops + workload.extra_flops(spec, tokens),
        "budget": spec.budget,
        "wall_time_s": t.wall_time_s,
        # Measured over every attempt's training time (evaluation included).
        "tokens_per_s": (steps_done - (branch.step if branch else 0))
        * spec.tokens_per_step
        / t.wall_time_s
        if t.wall_time_s > 0
        else None,
        "entropy_rate": data.entropy_rate,
        "unigram_entropy": data.unigram_entropy(),
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
        "autocast": autocast,
        "param_dtype": param_dtype,
    }


def _finite(value: float | None) -> float | None:
    """JSON has no NaN/Inf: non-finite losses of a diverged run become None."""
    return value if value is not None and math.isfinite(value) else None
