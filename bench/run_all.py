"""`make bench`: every benchmark in one process after another, each printing its ratios."""

from __future__ import annotations

import importlib

BENCHMARKS = (
    "bench.bench_mx",
    "bench.bench_train",
    "bench.bench_step",
    "bench.bench_sweep",
    "bench.bench_analysis",
    "bench.bench_load",
    "bench.bench_recipe",
    "bench.bench_scale",
)


def main() -> None:
    for name in BENCHMARKS:
        print(f"\n=== {name} ===", flush=True)
        importlib.import_module(name).main()


if __name__ == "__main__":
    main()
