"""Scale benchmarks of operating a big sweep (issue 16), absolute figures and target ratios:

- `sweep plan` of a 10,000-run grid as a whole process, and a launch of it (expansion,
  freezing the grid, 10,000 spec files, state of every run, selection) with an executor
  that submits nothing: target < 30 s each;
- `sweep status` on 10,000 run folders as a whole process: target < 2 s; `--failures`
  (grouped causes, one log tail per group): target < 3 s.

``python -m bench.bench_scale [--runs 10000]``
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sweep.launch as launch_module
from bench.bench_sweep import _sweep_command, make_sweep_folder
from sweep.grid import LaunchSettings
from sweep.launch import LaunchOptions, launch

PLAN_TARGET_S = 30.0
STATUS_TARGET_S = 2.0
FAILURES_TARGET_S = 3.0
CAUSES = (
    "RuntimeError: CUDA out of memory. Tried to allocate {} GiB",
    "ValueError: token id {} >= vocab_size 32000",
    "OSError: [Errno 5] Input/output error: '/scratch/{}/ckpt.pt'",
)


def _grid(path: Path, runs: int) -> Path:
    seeds = 100
    lrs = [round(1e-4 * (1 + i / 10), 8) for i in range(max(1, runs // seeds))]
    path.write_text(
        "name: scale\n"
        "base: {model: {vocab_size: 256, seq_len: 64, head_dim: 32, d_model: 64},"
        " train: {batch_size: 8, steps: 100}}\n"
        f"axes: {{seed: {list(range(seeds))}, train.lr: {lrs}}}\n"
    )
    return path


class _NullExecutor:
    def submit(self, run_dirs, attempts):
        return []


def _timed(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one whole process: on a shared machine the CPU time is the
    figure that does not depend on how many others are busy."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _verdict(seconds: float, target: float) -> str:
    verdict = "met" if seconds < target else "MISSED"
    return f"{seconds / target:.2f}x the {target:g} s target ({verdict})"


def bench_plan_launch(tmp: Path, runs: int) -> None:
    grid = _grid(tmp / "scale.yaml", runs)
    wall, cpu = _timed([*_sweep_command(), "plan", str(grid), "--json"])
    print(
        f"`sweep plan` of {runs:,} runs, whole process: {wall:.2f} s wall, {cpu:.2f} s CPU "
        f"= {_verdict(wall, PLAN_TARGET_S)}",
        flush=True,
    )
    launch_module.make_executor = lambda *args: _NullExecutor()
    start, cpu_start = time.perf_counter(), time.process_time()
    result = launch(grid, tmp / "launched", LaunchOptions(LaunchSettings(executor="local")))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(
        f"launch of {len(result.to_submit):,} runs (expand, freeze, write specs, select; no "
        f"executor): {wall:.2f} s wall, {cpu:.2f} s CPU = {_verdict(wall, PLAN_TARGET_S)}",
        flush=True,
    )


def _add_failure_causes(root: Path) -> int:
    """Give every failed run of the generated folder a reason and a log, as real ones have."""
    failed = 0
    for marker_path in root.glob("runs/*/state.json"):
        marker = json.loads(marker_path.read_text())
        if marker["state"] != "failed":
            continue
        cause = CAUSES[failed % len(CAUSES)].format(failed % 97 + 0.5)
        marker["reason"] = cause
        marker_path.write_text(json.dumps(marker))
        logs = marker_path.parent / "logs"
        logs.mkdir(exist_ok=True)
        (logs / "attempt-1.log").write_text("".join(f"step {i}\n" for i in range(200)) + cause)
        failed += 1
    return failed


def bench_status(tmp: Path, runs: int, repeats: int = 3) -> None:
    store = make_sweep_folder(tmp / "status", runs)
    print(f"generated {runs:,} run folders", flush=True)
    failed = _add_failure_causes(store.root)
    for flags, target in (
        ([], STATUS_TARGET_S),
        (["--json"], STATUS_TARGET_S),
        (["--failures"], FAILURES_TARGET_S),
    ):
        timings = [
            _timed([*_sweep_command(), "status", str(store.root), *flags]) for _ in range(repeats)
        ]
        wall = statistics.median(t[0] for t in timings)
        cpu = statistics.median(t[1] for t in timings)
        print(
            f"`sweep status DIR {' '.join(flags)}` on {runs:,} run folders ({failed:,} failed), "
            f"whole process: median {wall:.2f} s wall, {cpu:.2f} s CPU of {repeats} = "
            f"{_verdict(wall, target)}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        bench_plan_launch(Path(tmp), args.runs)
        bench_status(Path(tmp), args.runs)


if __name__ == "__main__":
    main(sys.argv[1:])
