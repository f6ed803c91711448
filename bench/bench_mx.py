"""MX emulation speed: quantizer GB/s and proxy training-step overhead, as ratios from one run.

    python -m bench.bench_mx [--batch 2048] [--steps 3]

Quantizer: 4096x4096 fp32 MXFP8 E4M3 fake-quant (8 bytes moved per element) with a
straightforward eager log2/floor implementation, the exact eager kernel, the compiled
fast path and a plain copy (the bandwidth ceiling). Training step: the paper's proxy
(residual MLP, depth 4, width 512) with all three GEMMs in MX E4M3 vs plain fp32.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

import mx
from models.config import ProxyConfig
from models.proxy import Student
from mx import fast

E4M3_MAX, E4M3_EMAX, E4M3_EMIN, E4M3_MBITS = 448.0, 8, -6, 3


def naive_quantize(x: torch.Tensor) -> torch.Tensor:
    """E4M3 FLOOR fake-quant the way a first emulator writes it (log2/floor, eager)."""
    blocks = x.reshape(-1, 32)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    scale = 2.0 ** (torch.floor(torch.log2(amax)) - E4M3_EMAX)
    y = blocks / scale
    exp = torch.floor(torch.log2(y.abs())).clamp(min=E4M3_EMIN)
    step = 2.0 ** (exp - E4M3_MBITS)
    q = (torch.round(y / step) * step).clamp(-E4M3_MAX, E4M3_MAX)
    return (q * scale).reshape(x.shape)


def best_time(fn: Callable[[], object], repeats: int = 5) -> float:
    """Best wall time of ``repeats`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_quantizer(n: int = 4096) -> None:
    x = torch.randn(n, n)
    out = torch.empty_like(x)
    gbs = {}

    def quant(mode: str) -> torch.Tensor:
        fast.set_mode(mode)
        return mx.quantize(x, "fp8_e4m3")

    start = time.perf_counter()
    quant("on")
    print(f"first compiled call (compile cost): {time.perf_counter() - start:.1f} s")
    cases = {
        "copy_ (preallocated)": lambda: out.copy_(x),
        "clone (fresh tensor)": x.clone,
        "naive log2/floor eager": lambda: naive_quantize(x),
        "mx exact eager": lambda: quant("off"),
        "mx fast (torch.compile)": lambda: quant("on"),
    }
    for name, fn in cases.items():
        repeats = 2 if "eager" in name else 5
        gbs[name] = 8 * x.numel() / best_time(fn, repeats) / 1e9
    exact = quant("off")
    same = torch.equal(exact, quant("on"))
    agree = (naive_quantize(x) == exact).float().mean().item()
    fast.set_mode("auto")
    print(f"\n{n}x{n} fp32 -> MXFP8 E4M3 (8 bytes/element)")
    for name, rate in gbs.items():
        print(f"  {name:26s} {rate:7.2f} GB/s")
    fastest = gbs["mx fast (torch.compile)"]
    print(f"  fast / naive  = {fastest / gbs['naive log2/floor eager']:.1f}x")
    print(f"  fast / eager  = {fastest / gbs['mx exact eager']:.1f}x")
    print(f"  fast / clone  = {fastest / gbs['clone (fresh tensor)']:.2f} of a plain copy")
    print(f"  fast bit-identical to eager: {same}; naive agrees on {agree:.6f} of elements")


def make_step(spec: mx.PrecisionSpec | None, batch: int) -> Callable[[], None]:
    """One full Adam step of a fresh proxy, optionally under ``spec``."""
    torch.manual_seed(0)
    model = Student(ProxyConfig(depth=4, width=512))
    if spec is not None:
        mx.apply(model, spec)
    opt = torch.optim.Adam(model.parameters(), lr=6e-4)
    x, target = torch.randn(batch, 512), torch.randn(batch, 512)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), target).backward()
        opt.step()

    return step


def bench_training(batch: int, steps: int) -> None:
    specs = {
        "fp32 plain": None,
        "MX E4M3 (3 GEMMs)": mx.PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3"),
        "bf16 GEMM operands": mx.PrecisionSpec(w_fmt="bf16", a_fmt="bf16"),
    }
    step_fns = {name: make_step(spec, batch) for name, spec in specs.items()}
    for step in step_fns.values():  # warm-up, including any compilation
        step()
        step()
    # Interleave the variants so load from other processes hits them alike.
    times: dict[str, list[float]] = {name: [] for name in specs}
    for _ in range(steps):
        for name, step in step_fns.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    plain = times["fp32 plain"]
    print(f"\nproxy step (depth 4, width 512, batch {batch}, Adam), median of {steps}")
    for name, samples in times.items():
        ratio = statistics.median(t / p for t, p in zip(samples, plain, strict=True))
        print(f"  {name:20s} {statistics.median(samples) * 1e3:8.1f} ms   ratio {ratio:.2f}x")


def main(argv: list[str] | None = None) -> None:
    """Run both benchmarks and print GB/s and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args(argv)
    reused = fast.keep_freed_memory()
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"glibc reuse of freed memory: {reused}"
    )
    bench_quantizer(args.size)
    bench_training(args.batch, args.steps)


if __name__ == "__main__":
    main()
