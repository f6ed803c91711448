"""Sweep benchmarks: `sweep status` on a generated 1,000-run folder as a whole process, against
a bare interpreter start, and the local executor's per-run overhead from dispatch to the start
of training, against a cold `python -c 'import torch'` (what a fresh process per run would
pay), each measured in the same process."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from models.config import LMConfig, RunSpec, TrainConfig
from sweep.executors.local import LocalExecutor
from sweep.status import run_row
from sweep.store import SweepStore

N_RUNS = 1000


def make_sweep_folder(root: Path, n_runs: int) -> SweepStore:
    """A sweep folder with n_runs runs in mixed states, as a real sweep leaves it."""
    store = SweepStore(root)
    specs = [
        RunSpec(
            model=LMConfig(d_model=64 * (1 + i % 8)),
            train=TrainConfig(steps=1000),
            seed=i,
            budget=1e18,
            tags={"config": f"cfg{i % 16}"},
        )
        for i in range(n_runs)
    ]
    store.initialise("name: bench\n", [s.run_id for s in specs], update_grid=False)
    states = ("done", "running", "failed", "diverged")
    for i, spec in enumerate(specs):
        run_dir = store.write_spec(spec.run_id, spec.model_dump_json())
        (run_dir / "submitted.json").write_text(
            json.dumps(
                {
                    "run_id": spec.run_id,
                    "executor": "slurm",
                    "job_id": f"{i}_0",
                    "attempt": 1,
                    "submitted_at": time.time(),
                }
            )
        )
        if i % 10:
            state = states[i % 4]
            (run_dir / "state.json").write_text(
                json.dumps(
                    {
                        "state": state,
                        "step": 500,
                        "attempt": 1,
                        "heartbeat": time.time(),
                        "host": "node1",
                        "pid": 1,
                        "last_loss": 3.2,
                    }
                )
            )
            if state in ("done", "diverged"):
                (run_dir / "summary.json").write_text(
                    json.dumps({"state": state, "steps_done": 1000, "final_val_loss": 3.1})
                )
    return store


def _sweep_command() -> list[str]:
    """The installed `sweep` console command next to this interpreter (what users run)."""
    script = Path(sys.executable).with_name("sweep")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sweep"]


def _process_seconds(argv: list[str], repeats: int) -> list[float]:
    """Wall time of `repeats` whole runs of argv (start, imports, work, exit), sorted."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return sorted(times)


def bench_status(tmp: Path, repeats: int = 7) -> None:
    store = make_sweep_folder(tmp / "status", N_RUNS)
    start = time.perf_counter()
    rows = [run_row(r) for r in store.records()]
    in_process = time.perf_counter() - start
    bare = statistics.median(_process_seconds([sys.executable, "-c", "pass"], repeats))
    print(
        f"status, {len(rows)} runs: reading the run folders takes {in_process:.3f} s in "
        f"process; a bare `python -c pass` starts and exits in {bare:.3f} s (median of {repeats})"
    )
    for flags in ([], ["--json"]):
        argv = [*_sweep_command(), "status", str(store.root), *flags]
        times = _process_seconds(argv, repeats)
        median = statistics.median(times)
        print(
            f"  `sweep status {' '.join(['DIR', *flags])}` whole process: median {median:.3f} s, "
            f"best {times[0]:.3f} s, worst {times[-1]:.3f} s over {repeats} runs = "
            f"{median / bare:.1f}x a bare interpreter (target < 1 s: "
            f"{'met' if median < 1 else 'MISSED'})"
        )


def bench_dispatch(tmp: Path, n_runs: int = 8) -> None:
    store = SweepStore(tmp / "dispatch")
    specs = [
        RunSpec(
            model=LMConfig(d_model=16, head_dim=16, vocab_size=64, seq_len=16),
            train=TrainConfig(steps=1, batch_size=2, eval_batches=1),
            seed=i,
        )
        for i in range(n_runs)
    ]
    store.initialise("name: dispatch\n", [s.run_id for s in specs], update_grid=False)
    dirs = [store.write_spec(s.run_id, s.model_dump_json()) for s in specs]
    outcomes = []
    executor = LocalExecutor(workers=2, on_event=lambda e, rid, o: outcomes.append(o))
    executor.submit(dirs, {d.name: 1 for d in dirs})
    # Per worker, the next run's first step minus the previous run's end is the whole
    # per-run overhead: dispatch, reading the spec, building model and data, first step.
    gaps = []
    by_worker: dict[int, list] = {}
    for outcome in sorted(outcomes, key=lambda o: o.started_at):
        by_worker.setdefault(outcome.worker_pid, []).append(outcome)
    for runs in by_worker.values():
        for previous, current in zip(runs, runs[1:], strict=False):
            marker = json.loads((store.runs_dir / current.run_id / "state.json").read_text())
            gaps.append(marker["first_step_at"] - previous.ended_at)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, models.train"], check=True)
    cold = time.perf_counter() - start
    worst = max(gaps)
    print(
        f"local executor, {n_runs} one-step runs on 2 warm workers: per-run overhead from "
        f"dispatch to first step: mean {sum(gaps) / len(gaps):.3f} s, max {worst:.3f} s "
        f"(target < 0.5 s: {'met' if worst < 0.5 else 'MISSED'}); a fresh process per run "
        f"would first pay {cold:.2f} s of imports ({cold / worst:.1f}x the worst gap)"
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bench_status(Path(tmp))
        bench_dispatch(Path(tmp))


if __name__ == "__main__":
    main()
