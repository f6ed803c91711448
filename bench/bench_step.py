"""MX and bf16-emulation LM training steps relative to fp32, per width and autocast setting.

    python -m bench.bench_step [--widths 64,128,256,512] [--steps 5]

The LM of ``bench.bench_train`` (vocab 512, seq 128, batch 16, one thread) at each d_model,
full training steps (forward, backward, clip, AdamW) of three precisions: plain fp32, bf16
emulation (bf16 GEMM operands and element-wise ops) and MXFP8 E4M3 (all three GEMMs, bf16
element-wise, bf16 LN affine), each under ``train.autocast: none`` and ``bf16``. The
variants are interleaved step by step and the ratio is the median of per-step ratios to the
fp32 step (autocast off) taken right before, so load from other processes hits all alike.
Goal: <= 1.5x at d_model 64 and <= 1.15x from 256 up.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
from models.train import Trainer
from mx.fast import keep_freed_memory
from mx.spec import PrecisionSpec

PRECISIONS = {
    "bf16": PrecisionSpec(w_fmt="bf16", a_fmt="bf16", elementwise="bf16"),
    "mx_e4m3": PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3", elementwise="bf16", ln="bf16"),
}
GOALS = {64: 1.5, 256: 1.15, 512: 1.15}


def trainer(d_model: int, precision: PrecisionSpec, autocast: str, run_dir: Path) -> Trainer:
    """A warmed-up trainer of the bench LM (warm-up pays MX kernel compilation)."""
    spec = RunSpec(
        model=LMConfig(d_model=d_model, vocab_size=512, seq_len=128),
        data=SyntheticData(),
        precision=precision,
        train=TrainConfig(steps=1000, batch_size=16, threads=1, autocast=autocast),
    )
    run = Trainer(spec, run_dir, None)
    for _ in range(2):
        run.train_step(stats=False)
    return run


def _timed(run: Trainer) -> float:
    start = time.perf_counter()
    run.train_step(stats=False)
    return time.perf_counter() - start


def ratios(d_model: int, steps: int) -> dict[tuple[str, str], float]:
    """Median step-time ratio to fp32 of each (precision, autocast) variant."""
    with tempfile.TemporaryDirectory() as tmp:
        base = trainer(d_model, PrecisionSpec(), "none", Path(tmp) / "fp32")
        variants = {
            (name, autocast): trainer(d_model, precision, autocast, Path(tmp) / f"{name}{autocast}")
            for name, precision in PRECISIONS.items()
            for autocast in ("none", "bf16")
        }
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in variants}
        for _ in range(steps):
            for key, run in variants.items():
                reference = _timed(base)
                samples[key].append(_timed(run) / reference)
    return {key: statistics.median(values) for key, values in samples.items()}


def main(argv: list[str] | None = None) -> None:
    """Print the step-time ratio table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="64,128,256,512")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_memory()
    keys = [(name, autocast) for name in PRECISIONS for autocast in ("none", "bf16")]
    print("step time / fp32 step time (median of interleaved steps, 1 thread)")
    print(f"{'d_model':>7}  " + "  ".join(f"{n + ' ac=' + a:>16}" for n, a in keys) + "  goal")
    for width in (int(w) for w in args.widths.split(",")):
        row = ratios(width, args.steps)
        goal = next((g for w, g in sorted(GOALS.items(), reverse=True) if width >= w), None)
        cells = "  ".join(f"{row[key]:>15.2f}x" for key in keys)
        print(f"{width:>7}  {cells}  {'' if goal is None else f'<= {goal}x'}", flush=True)


if __name__ == "__main__":
    main()
