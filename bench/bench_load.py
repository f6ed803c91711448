"""Benchmark: the analysis load one figure needs from a big sweep (metric pushdown).

``python -m bench.bench_load [--runs 1000] [--steps 10000] [--names 30] [--dir PATH]``
writes runs x steps x names metric rows in the run-folder layout (``runs/<id>/spec.json``,
``summary.json``, ``metrics/part-00000.parquet`` in models.metrics' schema, written with
pyarrow directly in two child processes) into a temp dir, then times in this one process:

- figure: the run table plus the two metrics a figure needs (train/loss, val/loss) through
  the pushdown loader (name filter + column projection). Peak RSS (getrusage) and Arrow's
  peak pool allocation cover it. Targets: < 10 s, < 2 GiB.
- full: every column of every metric row scanned batch by batch: the Parquet decoding a
  load of everything does (materialised as one frame that would be ``full_frame_gib``).

CPU seconds are printed next to wall seconds: on a shared machine the wall time includes
waiting for a core. A part interleaves every metric name row by row, so the scan still
decodes the filter columns of every row; pushdown saves memory, conversion and the
projected columns of parts without a match.

Generation runs in child processes, so the parent's peak RSS is the loads' alone.
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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TARGET_S = 10.0
TARGET_GIB = 2.0
FIGURE_NAMES = ("train/loss", "val/loss")
FIXED_NAMES = ("train/loss", "val/loss", "optim/grad_norm", "optim/lr")


def metric_names(n: int) -> list[str]:
    """``n`` metric names: the figure's two, then optimizer and per-layer clip-rate names."""
    extra = [f"mx/clip/layers.{i // 2}.{('fc1/a', 'ln/weight_clip')[i % 2]}" for i in range(n)]
    return [*FIXED_NAMES, *extra][:n]


def run_id(index: int) -> str:
    return f"fp8_e4m3_fp8_e4m3-{1e12 * 1.5 ** (index % 10):.3e}-64-{index // 10}"


def _write_runs(sweep_dir: Path, indices: range, steps: int, n_names: int, seed: int) -> None:
    """Write the run folders ``indices``: JSON records and one metrics part each."""
    from analysis.load import METRICS_SCHEMA

    names = metric_names(n_names)
    step = np.repeat(np.arange(steps, dtype=np.int64) * 10, len(names))
    n_rows = len(step)
    base = {
        "step": step,
        "tokens": step * 4096,
        "flops": step * 4096 * 6e6,
        "name": pa.DictionaryArray.from_arrays(
            np.tile(np.arange(len(names), dtype=np.int32), steps), names
        ),
    }
    wall = 1.7e9 + step * 0.05
    rng = np.random.default_rng(seed)
    zeros = np.zeros(n_rows, np.int32)
    for index in indices:
        rid = run_id(index)
        run_dir = sweep_dir / "runs" / rid
        (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
        spec = {"precision": {"w_fmt": "fp8_e4m3", "a_fmt": "fp8_e4m3"}, "seed": index // 10}
        summary = {"run_id": rid, "state": "done", "n_params": 1e6, "tokens": 4e9, "flops": 2.4e16,
                   "budget": 1e12 * 1.5 ** (index % 10), "final_val_loss": 3.0,
                   "min_val_loss": 2.9, "d_model": 64, "n_layers": 1}  # fmt: skip
        (run_dir / "spec.json").write_text(json.dumps(spec))
        (run_dir / "summary.json").write_text(json.dumps(summary))
        columns = {
            "run_id": pa.DictionaryArray.from_arrays(zeros, [rid]).cast(pa.string()),
            **base,
            "value": 3.0 + rng.random(n_rows),
            "wall_time": wall,
        }
        table = pa.table(columns, schema=METRICS_SCHEMA)
        pq.write_table(table, run_dir / "metrics" / "part-00000.parquet")


def generate(sweep_dir: Path, runs: int, steps: int, names: int, workers: int = 1) -> None:
    """Write ``runs`` finished run folders with ``steps`` x ``names`` metric rows each (in
    ``workers`` child processes; 1: in this process)."""
    if workers <= 1:
        _write_runs(Path(sweep_dir), range(runs), steps, names, 0)
        return
    ctx = get_context("spawn")
    chunks = [range(i, runs, workers) for i in range(workers)]
    children = [
        ctx.Process(target=_write_runs, args=(Path(sweep_dir), chunk, steps, names, i))
        for i, chunk in enumerate(chunks)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join()
    if any(child.exitcode for child in children):
        raise RuntimeError("generating the sweep failed in a child process")


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _cpu_s() -> float:
    """CPU seconds of this process (all threads): on a shared machine wall time also counts
    waiting for a core."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def figure_load(sweep_dir: Path) -> tuple[int, int]:
    """What a figure of FIGURE_NAMES loads: the run table and those two metrics; return
    (runs, metric rows)."""
    from analysis.registry import Needs
    from analysis.report import load_source

    src = load_source(sweep_dir, paper=False)
    metrics = src.metrics(Needs(metrics=FIGURE_NAMES, columns=("run_id", "step", "name", "value")))
    return len(src.runs), 0 if metrics is None else len(metrics)


def full_scan(sweep_dir: Path) -> int:
    """Decode every column of every metric row batch by batch; return the row count."""
    from analysis.load import metrics_dataset

    dataset = metrics_dataset(sweep_dir)
    return 0 if dataset is None else sum(b.num_rows for b in dataset.to_batches())


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Generate (unless ``--dir`` holds a sweep) and time the figure load vs a full scan;
    print and return the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--names", type=int, default=30)
    parser.add_argument("--dir", type=Path, default=None, help="keep/reuse the sweep here")
    args = parser.parse_args(argv)
    sweep_dir = args.dir or Path(tempfile.mkdtemp(prefix="bench_load_"))
    start = time.perf_counter()
    if not (sweep_dir / "runs").is_dir():
        generate(sweep_dir, args.runs, args.steps, args.names, workers=2)
    generated = time.perf_counter() - start
    import analysis.report  # noqa: F401  (imports are not part of the load)

    rss_before = _peak_rss_gib()
    start, cpu = time.perf_counter(), _cpu_s()
    runs, rows = figure_load(sweep_dir)
    figure_s, figure_cpu = time.perf_counter() - start, _cpu_s() - cpu
    figure_rss = _peak_rss_gib()
    arrow_peak = pa.default_memory_pool().max_memory() / 2**30
    start, cpu = time.perf_counter(), _cpu_s()
    all_rows = full_scan(sweep_dir)
    full_s, full_cpu = time.perf_counter() - start, _cpu_s() - cpu
    if args.dir is None:
        shutil.rmtree(sweep_dir)
    # One frame of every row: int32 codes for run_id and name, five 8-byte columns.
    full_frame_gib = all_rows * (4 + 4 + 5 * 8) / 2**30
    result = {
        "runs": runs,
        "metric_rows_total": all_rows,
        "figure_rows": rows,
        "generate_s": round(generated, 1),
        "figure_load_s": round(figure_s, 2),
        "figure_cpu_s": round(figure_cpu, 2),
        "figure_peak_rss_gib": round(figure_rss, 3),
        "rss_before_load_gib": round(rss_before, 3),
        "arrow_peak_gib": round(arrow_peak, 3),
        "full_scan_s": round(full_s, 2),
        "full_scan_cpu_s": round(full_cpu, 2),
        "full_over_figure": round(full_s / figure_s, 2),
        "full_frame_gib": round(full_frame_gib, 1),
        "ok": figure_s < TARGET_S and figure_rss < TARGET_GIB,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
