"""Benchmarks: loading a generated sweep, and the scaling-law fits on the paper's runs.

Loading (target: 10 M rows in < 15 s, < 3 GiB):
``python -m bench.bench_analysis [--runs 1000] [--points 5000] [--dir PATH]``: each run logs
train/loss and optim/grad_norm at ``points`` steps, so rows = runs * points * 2. Generation
runs in a child process so the parent's peak RSS measures loading alone.

Fits (``--fits-only`` skips loading): Chinchilla, Kaplan and IsoFLOP point fits on each of the
paper's 16 configurations (seconds for all), milliseconds per bootstrap refit, and the Kaplan /
Chinchilla ratio (target: Kaplan no slower than Chinchilla).
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

from analysis.fit import bootstrap, fit_chinchilla, fit_kaplan
from analysis.isoflop import isoflop_fits
from analysis.laws import usable
from analysis.load import load_metrics, load_paper_runs, load_sweep_runs
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


def bench_fits(n_boot: int = 20) -> dict[str, float]:
    """Time the per-configuration fits on the paper's runs; print and return the timings."""
    runs = usable(load_paper_runs(), "min_val_loss")
    data = [
        (g["n_params"].to_numpy(), g["tokens"].to_numpy(), g["min_val_loss"].to_numpy())
        for _, g in runs.groupby("config")
    ]
    result: dict[str, float] = {"configs": len(data)}
    for name, fitter in (("chinchilla", fit_chinchilla), ("kaplan", fit_kaplan)):
        start = time.perf_counter()
        fits = [fitter(*d) for d in data]
        result[f"{name}_s"] = round(time.perf_counter() - start, 2)
        # Bootstrap refits start from the point estimate; one process so the time is per core.
        start = time.perf_counter()
        bootstrap(fits[0], data[0][:2], data[0][2], n_boot=n_boot, workers=1)
        result[f"{name}_refit_ms"] = round(1e3 * (time.perf_counter() - start) / n_boot, 1)
    start = time.perf_counter()
    isoflop_fits(runs)
    result["isoflop_s"] = round(time.perf_counter() - start, 2)
    result["kaplan_over_chinchilla"] = round(result["kaplan_s"] / result["chinchilla_s"], 2)
    result["ok"] = result["kaplan_over_chinchilla"] <= 1
    print(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Generate (if needed) and load a sweep, then time the fits; print and return the
    timings and peak memory."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=5000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--fits-only", action="store_true", help="skip the loading benchmark")
    args = parser.parse_args(argv)
    if args.fits_only:
        return bench_fits()
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
    return result | {f"fits_{k}": v for k, v in bench_fits().items()}


if __name__ == "__main__":
    main()
