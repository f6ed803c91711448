"""Training throughput on CPU against torch.matmul at the model's own GEMM sizes.

Run: ``python -m bench.bench_train``. One thread for both the model and the matmul
reference, as the sweep runs one run per core. Achieved FLOP/s counts 6·N per token plus
attention (the attention-inclusive count), i.e. the useful work of a training step.
"""

from __future__ import annotations

import tempfile
import time

import torch

from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
from models.flops import lm_attention_flops_per_token
from models.train import Trainer
from mx.spec import PrecisionSpec

MODEL = LMConfig(d_model=256, vocab_size=512, seq_len=128)
BATCH = 16
PRECISIONS = {
    "fp32": PrecisionSpec(),
    "mx_fp8_e4m3": PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3"),
}


def gemm_shapes(cfg: LMConfig, tokens: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of every forward GEMM of one step (backward repeats them transposed)."""
    d, hidden = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    layer = [(tokens, d, 3 * d), (tokens, d, d), (tokens, d, hidden), (tokens, hidden, d)]
    return layer * cfg.n_layers + [(tokens, d, cfg.vocab_size)]


def matmul_flops_per_s(shapes: list[tuple[int, int, int]], repeats: int = 20) -> float:
    """FLOP/s of torch.matmul running exactly these GEMMs back to back."""
    operands = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in shapes]
    for a, b in operands:
        torch.matmul(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        for a, b in operands:
            torch.matmul(a, b)
    elapsed = time.perf_counter() - start
    return repeats * sum(2.0 * m * k * n for m, k, n in shapes) / elapsed


def train_tokens_per_s(precision: PrecisionSpec, steps: int, warmup: int) -> float:
    """Tokens per second of full training steps (forward, backward, clip, AdamW)."""
    spec = RunSpec(
        model=MODEL,
        data=SyntheticData(),
        precision=precision,
        train=TrainConfig(steps=warmup + steps, batch_size=BATCH, threads=1),
    )
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(spec, run_dir, None)
        for _ in range(warmup):  # also pays one-time costs (MX kernel compilation)
            trainer.train_step(stats=False)
            trainer.step += 1
        start = time.perf_counter()
        for _ in range(steps):
            trainer.train_step(stats=False)
            trainer.step += 1
        return steps * spec.tokens_per_step / (time.perf_counter() - start)


def main() -> None:
    """Print tokens/s, achieved FLOP/s and the ratio to matmul FLOP/s per precision."""
    torch.set_num_threads(1)
    tokens = BATCH * MODEL.seq_len
    flops_per_token = 6.0 * MODEL.param_count() + lm_attention_flops_per_token(
        MODEL.d_model, MODEL.n_layers, MODEL.seq_len
    )
    reference = matmul_flops_per_s(gemm_shapes(MODEL, tokens))
    print(
        f"model d={MODEL.d_model} L={MODEL.n_layers} V={MODEL.vocab_size} "
        f"T={MODEL.seq_len} B={BATCH}; N={MODEL.param_count():,}"
    )
    print(f"torch.matmul at the model's GEMM sizes: {reference / 1e9:.1f} GFLOP/s (1 thread)")
    for name, precision in PRECISIONS.items():
        steps, warmup = (20, 3) if precision.is_noop else (5, 3)
        rate = train_tokens_per_s(precision, steps, warmup)
        achieved = rate * flops_per_token
        print(
            f"{name:>12}: {rate:,.0f} tokens/s, {achieved / 1e9:.1f} GFLOP/s, "
            f"{achieved / reference:.0%} of matmul"
        )


if __name__ == "__main__":
    main()
