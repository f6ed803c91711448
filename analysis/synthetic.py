"""Synthetic sweep folders with a known scaling law, for tests and benchmarks.

Writes exactly what a real sweep writes (spec.json, state.json, summary.json and
metrics/part-*.parquet in the long schema) so the loaders are exercised end to end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.configs import parse_config
from runfolder.metrics import metrics_schema

VOCAB = 256
SEQ_LEN = 64
BATCH = 8


@dataclass(frozen=True)
class Law:
    """L(N, D) = E + A/(N*f)^alpha + B/D^beta, with f the configuration's N-efficiency."""

    E: float = 1.8
    A: float = 30.0
    B: float = 60.0
    alpha: float = 0.35
    beta: float = 0.3

    def loss(self, n: np.ndarray, d: np.ndarray, efficiency: float = 1.0) -> np.ndarray:
        return self.E + self.A / (n * efficiency) ** self.alpha + self.B / d**self.beta


def param_count(d_model: int, n_layers: int, vocab: int = VOCAB) -> int:
    """The paper's N: 12*L*d^2 + 2*V*d + (4L+1)*d (embeddings and untied head included)."""
    return 12 * n_layers * d_model**2 + 2 * vocab * d_model + (4 * n_layers + 1) * d_model


def write_metrics(
    path: Path,
    run_id: str,
    names: dict[str, np.ndarray],
    tokens_per_step: int,
    flops_per_token: float,
) -> None:
    """Write one Parquet part holding every named per-step series (step = index * 10)."""
    parts = []
    for name, values in names.items():
        steps = np.arange(len(values), dtype=np.int64) * 10
        tokens = steps * tokens_per_step
        parts.append(
            pa.table(
                {
                    "run_id": pa.array([run_id] * len(values), pa.string()),
                    "step": steps,
                    "tokens": tokens,
                    "flops": tokens * flops_per_token,
                    "name": pa.DictionaryArray.from_arrays(np.zeros(len(values), np.int32), [name]),
                    "value": np.asarray(values, float),
                    "wall_time": steps * 0.01,
                },
                schema=metrics_schema(),
            )
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.concat_tables(parts, promote_options="permissive"), path)


def _curve(
    final: float, n_points: int, rng: np.random.Generator, spike_at: int | None
) -> np.ndarray:
    t = np.arange(n_points)
    loss = final + (np.log(VOCAB) - final) * np.exp(-t / max(n_points / 8, 1))
    loss = loss + rng.normal(0, 0.01, n_points)
    if spike_at is not None:
        # A loss that climbs and never comes back: the non-recovering instability.
        loss[spike_at:] += np.linspace(0, 1.0, n_points - spike_at)
    return loss


def write_synthetic_sweep(
    sweep_dir: Path,
    *,
    configs: dict[str, float],
    budgets: Sequence[float],
    shapes: Sequence[tuple[int, int]],
    seeds: Sequence[int] = (0,),
    law: Law = Law(),
    noise: float = 0.005,
    n_points: int = 100,
    unstable: dict[str, float] | None = None,
    metrics: bool = True,
    rng_seed: int = 0,
) -> list[Path]:
    """Write one finished run per (config, budget, shape, seed); return the run folders.

    ``configs`` maps a configuration name ("bf16_bf16") to its N-efficiency factor.
    ``unstable`` maps a configuration to the budget from which its runs blow up late in
    training (final val loss above its best, i.e. non-recovery).
    """
    rng = np.random.default_rng(rng_seed)
    unstable = unstable or {}
    dirs = []
    for config, eff in configs.items():
        w_fmt, a_fmt, _ = parse_config(config)
        for budget in budgets:
            for d_model, n_layers in shapes:
                for seed in seeds:
                    n = param_count(d_model, n_layers)
                    tokens_per_step = BATCH * SEQ_LEN
                    steps = max(1, int(budget / (6 * n * tokens_per_step)))
                    d = steps * tokens_per_step
                    final = float(law.loss(n, d, eff) * np.exp(rng.normal(0, noise)))
                    blows = budget >= unstable.get(config, np.inf)
                    curve = _curve(final, n_points, rng, int(0.7 * n_points) if blows else None)
                    val = curve[:: max(1, n_points // 10)]
                    run_id = f"{config}-{budget:.3e}-{d_model}-{seed}".replace("+", "")
                    run_dir = Path(sweep_dir) / "runs" / run_id
                    run_dir.mkdir(parents=True, exist_ok=True)
                    spec = {
                        "model": {
                            "d_model": d_model,
                            "n_layers": n_layers,
                            "vocab_size": VOCAB,
                            "seq_len": SEQ_LEN,
                        },
                        "train": {"steps": steps, "batch_size": BATCH},
                        "precision": {
                            "w_fmt": w_fmt,
                            "a_fmt": a_fmt,
                            "block_size": 32,
                            "quantize_backward": True,
                        },
                        "seed": seed,
                        "budget": budget,
                        "tags": {},
                    }
                    summary = {
                        "run_id": run_id,
                        "state": "done",
                        "steps_done": steps,
                        "total_steps": steps,
                        "diverged_step": None,
                        "final_val_loss": float(val[-1]),
                        "min_val_loss": float(val.min()),
                        "final_train_loss": float(curve[-1]),
                        "initial_loss": float(curve[0]),
                        "n_params": n,
                        "tokens": d,
                        "flops": 6.0 * n * d,
                        "budget": budget,
                        "config": config,
                        "w_fmt": w_fmt,
                        "a_fmt": a_fmt,
                        "d_model": d_model,
                        "n_layers": n_layers,
                        "seed": seed,
                    }
                    (run_dir / "spec.json").write_text(json.dumps(spec))
                    (run_dir / "state.json").write_text(
                        json.dumps({"state": "done", "step": steps, "total_steps": steps})
                    )
                    (run_dir / "summary.json").write_text(json.dumps(summary))
                    if metrics:
                        grad = 1.0 + 0.05 * rng.standard_normal(n_points) ** 2
                        write_metrics(
                            run_dir / "metrics" / "part-00000.parquet",
                            run_id,
                            {"train/loss": curve, "optim/grad_norm": grad},
                            tokens_per_step,
                            6.0 * n,
                        )
                    dirs.append(run_dir)
    return dirs
