"""Benchmark: load a generated sweep of many runs x steps (target: 10 M rows in < 15 s, < 3 GiB).

``python -m bench.bench_analysis [--runs 1000] [--points 5000] [--dir PATH]``: each run logs
train/loss and optim/grad_norm at ``points`` steps, so rows = runs * points * 2. Generation
runs in a child process so the parent's peak RSS measures loading alone.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

from analysis.load import load_metrics, load_sweep_runs
from analysis.synthetic import write_synthetic_sweep

TARGET_S = 15.0
TARGET_GIB = 3.0


def generate(sweep_dir: Path, runs: int, points: int) -> None:
    """Write ``runs`` finished runs (10 configs x 10 budgets x shapes x seeds)."""
    configs = {f"fp8_e4m3_fp8_e4m3_block_size_{i}": 1.0 for i in range(1, 11)}
    per_config = runs // len(configs)
    budgets = [1e12 * 1.5**i for i in range(10)]
    seeds = range(max(1, per_config // len(budgets)))
    write_synthetic_sweep(
        sweep_dir, configs=configs, budgets=budgets, shapes=[(64, 1)], seeds=seeds, n_points=points
    )


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Generate (if needed) and load a sweep; print and return the timings and peak memory."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=5000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    sweep_dir = args.dir or Path(tempfile.mkdtemp(prefix="bench_analysis_"))
    start = time.perf_counter()
    if not (sweep_dir / "runs").is_dir():
        child = get_context("spawn").Process(
            target=generate, args=(sweep_dir, args.runs, args.points)
        )
        child.start()
        child.join()
        if child.exitcode:
            raise RuntimeError(f"generating the sweep failed (exit code {child.exitcode})")
    generated = time.perf_counter() - start
    start = time.perf_counter()
    runs = load_sweep_runs(sweep_dir)
    metrics = load_metrics(sweep_dir)
    load_s = time.perf_counter() - start
    if args.dir is None:
        shutil.rmtree(sweep_dir)
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    result = {
        "runs": len(runs),
        "rows": len(metrics),
        "generate_s": round(generated, 2),
        "load_s": round(load_s, 2),
        "peak_rss_gib": round(peak_gib, 3),
        "ok": load_s < TARGET_S and peak_gib < TARGET_GIB,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
