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
from pathlib import Path

import pyarrow as pa

from analysis.synthetic import write_wide_sweep

TARGET_S = 10.0
TARGET_GIB = 2.0
FIGURE_NAMES = ("train/loss", "val/loss")  # the first two names write_wide_sweep logs


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
        write_wide_sweep(sweep_dir, args.runs, args.steps, args.names, workers=2)
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
