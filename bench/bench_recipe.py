"""Cost of stochastic rounding, NVFP4 and the Hadamard wgrad per training step, as ratios
to round-to-nearest MXFP8 E4M3 measured in the same process.

    python -m bench.bench_recipe [--batch 1024] [--width 256] [--repeats 3]

Workload: the paper's proxy student (residual MLP, depth 2) with all three GEMMs quantized.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

import mx
from bench.bench_mx import best_time
from models.config import ProxyConfig
from models.proxy import Student

BASE = {"w_fmt": "fp8_e4m3", "a_fmt": "fp8_e4m3", "rounding": "even"}
NV = {"w_fmt": "nvfp4", "a_fmt": "nvfp4", "rounding": "even"}
RECIPES = {
    "mxfp8 rne": BASE,
    "mxfp8 sr grads": {**BASE, "grad_rounding": "stochastic"},
    "mxfp8 sr all": {**BASE, "rounding": "stochastic"},
    "mxfp8 rht": {**BASE, "hadamard_wgrad": True},
    "nvfp4 rne": NV,
    "nvfp4 sr grads": {**NV, "grad_rounding": "stochastic"},
    "nvfp4 sr grads + rht": {**NV, "grad_rounding": "stochastic", "hadamard_wgrad": True},
}


def step_time(spec: mx.PrecisionSpec, batch: int, width: int, repeats: int) -> float:
    """Best seconds of one forward+backward step of the proxy under ``spec``."""
    torch.manual_seed(0)
    model = mx.apply(Student(ProxyConfig(depth=2, width=width)), spec, seed=0)
    x, target = torch.randn(batch, width), torch.randn(batch, width)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), target).backward()

    return best_time(step, repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    times = {
        name: step_time(mx.PrecisionSpec(**fields), args.batch, args.width, args.repeats)
        for name, fields in RECIPES.items()
    }
    base = times["mxfp8 rne"]
    print(f"recipe cost per proxy step (batch {args.batch}, width {args.width}, depth 2)")
    for name, seconds in times.items():
        print(f"  {name:24s} {seconds * 1e3:8.1f} ms  x{seconds / base:5.2f} vs MXFP8 RNE")


if __name__ == "__main__":
    main()
