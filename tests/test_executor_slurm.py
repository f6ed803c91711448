"""SLURM executor: pure helpers always; the rest against a real cluster (slurm/local-cluster.sh)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from executor_fixtures import (
    HELD,
    PREEMPTIBLE,
    QUICK,
    fake_command,
    make_run_dirs,
    requires_slurm,
    two_run_grid,
    wait_until,
)
from rich.console import Console

from runfolder.records import Submission
from sweep.executors.slurm import (
    ChunkSubmitted,
    SlurmExecutor,
    SlurmUnavailableError,
    chunk_runs,
    parse_job_states,
    scheduler_state,
    slurm_available,
    task_outcome,
)
from sweep.grid import LaunchSettings

STATE_TIMEOUT_S = 60


def _fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scripts: dict[str, str]) -> None:
    """Put shell scripts named like SLURM commands first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def _sacct_state(job_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", job_id.split("_")[0]],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_job_states(out.splitlines()).get(job_id, "")


@pytest.fixture
def slurm_jobs(tmp_path: Path) -> Iterator[list[Submission]]:
    """Submissions a test appends here are scancelled afterwards, even when it fails."""
    subs: list[Submission] = []
    yield subs
    job_ids = [sub.job_id for sub in subs if sub.job_id]
    if job_ids:
        subprocess.run(["scancel", *job_ids], check=False)


def _executor(tmp_path: Path, script: str, **kwargs: object) -> SlurmExecutor:
    return SlurmExecutor(tmp_path, time_min=5, command=fake_command(script), **kwargs)


def _query_one(executor: SlurmExecutor, sub: Submission) -> str:
    return executor.query([sub])[sub.run_id]


# --- pure helpers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "max_array_size", "sizes"),
    [(0, 5, []), (4, 5, [4]), (5, 5, [4, 1]), (9, 3, [2, 2, 2, 2, 1]), (2000, 1001, [1000] * 2)],
)
def test_chunks_stay_below_max_array_size(count: int, max_array_size: int, sizes: list[int]):
    items = list(range(count))
    chunks = chunk_runs(items, max_array_size)
    assert [len(chunk) for chunk in chunks] == sizes
    assert [item for chunk in chunks for item in chunk] == items


def test_chunking_rejects_a_max_array_size_below_two():
    with pytest.raises(ValueError, match="max_array_size must be >= 2, got 1"):
        chunk_runs([1, 2], 1)


# 2,100 runs under MaxArraySize 1001: chunks of 1000, 1000 and 100.
THREE_CHUNKS = [
    ChunkSubmitted(1, 3, "41", 1000, 1000, 2100),
    ChunkSubmitted(2, 3, "42", 1000, 2000, 2100),
    ChunkSubmitted(3, 3, "43", 100, 2100, 2100),
]


def _show_chunks(console: Console, chunks: list[ChunkSubmitted], runs: int) -> None:
    from sweep.progress import LaunchProgress

    with LaunchProgress(console) as progress:
        progress.start(list(range(runs)), "slurm")
        for chunk in chunks:
            progress.on_chunk(chunk)


def test_chunk_progress_off_a_terminal_is_one_line_per_chunk():
    out = io.StringIO()
    _show_chunks(Console(file=out, force_terminal=False, width=200), THREE_CHUNKS, 2100)
    assert out.getvalue().splitlines() == [
        "chunk 1/3: array 41, 1000 runs (1000/2100 submitted)",
        "chunk 2/3: array 42, 1000 runs (2000/2100 submitted)",
        "chunk 3/3: array 43, 100 runs (2100/2100 submitted)",
    ]


def test_chunk_progress_on_a_terminal_ends_with_a_full_bar():
    out = io.StringIO()
    _show_chunks(Console(file=out, force_terminal=True, width=120), THREE_CHUNKS, 2100)
    shown = out.getvalue()
    assert "chunk 3/3: array 43, 100 runs (2100/2100 submitted)" in shown
    last_frame = shown.rsplit("\r", 1)[-1]
    assert "chunks" in last_frame and "3/3" in last_frame and "runs 2100/2100" in last_frame


def test_parse_job_states_expands_folded_arrays_and_prefers_task_records():
    lines = [
        "7_0|RUNNING",
        "7_1|CANCELLED by 0",
        "7_[1-3,6%2]|PENDING",
        "8|COMPLETED",
        "9_2|CANCELLED by 0",
        "junk",
    ]
    states = parse_job_states(lines)
    assert states == {
        "7_0": "RUNNING",
        "7_1": "CANCELLED by 0",
        "7_2": "PENDING",
        "7_3": "PENDING",
        "7_6": "PENDING",
        "8": "COMPLETED",
        "9_2": "CANCELLED by 0",
    }


@pytest.mark.parametrize(
    ("slurm", "ours"),
    [
        ("PENDING", "queued"),
        ("REQUEUED", "queued"),
        ("RUNNING", "running"),
        ("COMPLETING", "running"),
        ("COMPLETED", "gone"),
        ("FAILED", "gone"),
        ("CANCELLED by 0", "gone"),
        ("TIMEOUT", "gone"),
        ("NODE_FAIL", "gone"),
        ("OUT_OF_MEMORY", "gone"),
        ("", "gone"),
    ],
)
def test_scheduler_state_mapping(slurm: str, ours: str):
    assert scheduler_state(slurm) == ours


@pytest.mark.parametrize(
    ("returncode", "received", "outcome"),
    [
        (0, set(), "done"),
        (0, {signal.SIGTERM}, "done"),
        (75, set(), "requeue"),
        (75, {signal.SIGUSR2}, "requeue"),
        (-signal.SIGUSR2, {signal.SIGUSR2}, "requeue"),
        (-signal.SIGTERM, {signal.SIGUSR2}, "failed"),
        (-signal.SIGKILL, set(), "failed"),
        (1, {signal.SIGTERM}, "failed"),
    ],
)
def test_task_outcome(returncode: int, received: set[int], outcome: str):
    assert task_outcome(returncode, received) == outcome


def test_missing_sbatch_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not slurm_available()
    with pytest.raises(SlurmUnavailableError, match="sbatch not found on PATH"):
        SlurmExecutor(tmp_path)


def test_bad_resources_name_the_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _fake_bin(tmp_path, monkeypatch, {"sbatch": "exit 1"})
    with pytest.raises(ValueError, match="cpus_per_task must be >= 1, got 0"):
        SlurmExecutor(tmp_path, cpus_per_task=0)
    with pytest.raises(ValueError, match="mem_gb must be > 0, got -1"):
        SlurmExecutor(tmp_path, mem_gb=-1)


@pytest.mark.parametrize(("time_min", "warned_s"), [(1, 15), (4, 60), (6, 90), (600, 90)])
def test_short_time_limits_are_warned_after_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, time_min: int, warned_s: int
):
    # submitit's fixed USR2@90 reaches a 1-minute job as it starts: it would checkpoint and
    # requeue itself forever. The sbatch script submitit writes carries the clamped delay.
    from submitit.slurm.slurm import _make_sbatch_string

    _fake_bin(tmp_path, monkeypatch, {"sbatch": "exit 1"})
    executor = SlurmExecutor(tmp_path, time_min=time_min)
    script = _make_sbatch_string(command="true", folder=tmp_path, **executor.parameters)
    assert f"#SBATCH --signal=USR2@{warned_s}\n" in script
    assert f"#SBATCH --time={time_min}\n" in script


def test_unreachable_controller_reads_unknown_not_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A controller restart must not make queued runs look lost (that would duplicate them).
    down = "echo 'Unable to contact slurm controller (connect failure)' >&2; exit 1"
    _fake_bin(tmp_path, monkeypatch, {"sbatch": "exit 1", "sacct": down, "squeue": down})
    executor = SlurmExecutor(tmp_path)
    subs = [Submission("a", "slurm", "12_0", 1), Submission("b", "slurm", None, 1)]
    assert executor.query(subs) == {"a": "unknown"}


# --- real cluster -------------------------------------------------------------------------


@pytest.mark.slurm
@pytest.mark.slow
@requires_slurm
def test_array_lifecycle_cancel_and_kill(tmp_path: Path, slurm_jobs: list[Submission]):
    runs = make_run_dirs(tmp_path, 4)
    executor = _executor(tmp_path, HELD, settings=LaunchSettings(array_parallelism=2))
    subs = executor.submit(runs, {"run0": 1, "run1": 1, "run2": 2, "run3": 1})
    slurm_jobs += subs

    assert [sub.run_id for sub in subs] == ["run0", "run1", "run2", "run3"]
    assert [sub.attempt for sub in subs] == [1, 1, 2, 1]
    array_ids = {sub.job_id.split("_")[0] for sub in subs}
    assert len(array_ids) == 1, f"one sbatch for one chunk, got arrays {array_ids}"
    assert sorted(sub.job_id.split("_")[1] for sub in subs) == ["0", "1", "2", "3"]

    # array_parallelism=2: two tasks run, the third waits in the queue.
    wait_until(
        lambda: list(executor.query(subs).values()) == ["running", "running", "queued", "queued"],
        STATE_TIMEOUT_S,
        "two running and two queued",
    )
    wait_until(lambda: all((d / "started").exists() for d in runs[:2]), 30, "commands to start")

    executor.cancel([subs[2]])
    wait_until(lambda: _query_one(executor, subs[2]) == "gone", STATE_TIMEOUT_S, "cancel")
    # sacct may keep no record of a task cancelled while pending (it leaves the folded
    # range); the controller still answers for it.
    assert not (runs[2] / "started").exists()

    subprocess.run(["scancel", "--signal", "KILL", subs[1].job_id], check=True)
    wait_until(lambda: _query_one(executor, subs[1]) == "gone", STATE_TIMEOUT_S, "killed task")

    # run3 takes the freed slot. Cancelling it while running: its command dies of SIGTERM
    # and the task must not requeue it.
    wait_until(lambda: (runs[3] / "started").exists(), STATE_TIMEOUT_S, "run3 to start")
    executor.cancel([subs[3]])
    wait_until(lambda: _query_one(executor, subs[3]) == "gone", STATE_TIMEOUT_S, "cancel run3")
    wait_until(lambda: _sacct_state(subs[3].job_id).startswith("CANCELLED"), 30, "run3 CANCELLED")
    time.sleep(3)  # a wrongful requeue would show up as queued within this
    assert _query_one(executor, subs[3]) == "gone"

    (runs[0] / "release").write_text("x")
    wait_until(lambda: _query_one(executor, subs[0]) == "gone", STATE_TIMEOUT_S, "completion")
    wait_until(lambda: _sacct_state(subs[0].job_id) == "COMPLETED", 30, "sacct COMPLETED")
    assert (runs[0] / "done").read_text() == "x"
    assert not (runs[1] / "done").exists(), "the killed run must not have finished"
    assert not (runs[2] / "started").exists(), "the cancelled run must never have started"
    assert (runs[3] / "started").read_text() == "x", "the cancelled run3 ran once"
    assert (runs[0] / "logs" / "attempt-1.out").exists()
    assert (runs[0] / "logs" / "attempt-1.err").exists()


@pytest.mark.slurm
@pytest.mark.slow
@requires_slurm
def test_small_max_array_size_gives_one_sbatch_per_chunk(
    tmp_path: Path, slurm_jobs: list[Submission]
):
    runs = make_run_dirs(tmp_path, 3)
    executor = _executor(tmp_path, QUICK, max_array_size=3)
    subs = executor.submit(runs, {})
    slurm_jobs += subs

    jobs = [sub.job_id.split("_")[0] for sub in subs]
    assert jobs[0] == jobs[1] != jobs[2], f"expected chunks of 2 and 1, got {jobs}"
    assert [subs[0].job_id, subs[1].job_id] == [f"{jobs[0]}_0", f"{jobs[0]}_1"]
    wait_until(
        lambda: set(executor.query(subs).values()) == {"gone"}, STATE_TIMEOUT_S, "all runs end"
    )
    assert [(d / "done").read_text() for d in runs] == ["x"] * 3
    assert (runs[2] / "logs" / "attempt-1.out").read_text() == "ran run2\n"


@pytest.mark.slurm
@requires_slurm
def test_each_chunk_is_reported_once_sbatch_accepted_it(
    tmp_path: Path, slurm_jobs: list[Submission]
):
    runs = make_run_dirs(tmp_path, 5)
    chunks: list[ChunkSubmitted] = []
    executor = _executor(tmp_path, QUICK, max_array_size=3, on_chunk=chunks.append)
    subs = executor.submit(runs, {})
    slurm_jobs += subs

    assert [(c.index, c.chunks, c.size, c.runs_submitted, c.runs_total) for c in chunks] == [
        (1, 3, 2, 2, 5),
        (2, 3, 2, 4, 5),
        (3, 3, 1, 5, 5),
    ]
    # Chunks of two are arrays ("<array>_<task>"); a chunk of one is a plain job.
    assert [c.array_id for c in chunks] == [
        subs[0].job_id.split("_")[0],
        subs[2].job_id.split("_")[0],
        subs[4].job_id,
    ]
    assert subs[1].job_id == f"{chunks[0].array_id}_1"
    assert len({c.array_id for c in chunks}) == 3


@pytest.mark.slurm
@requires_slurm
def test_piped_cli_launch_prints_one_line_per_chunk(
    tmp_path: Path, repo_root: Path, slurm_jobs: list[Submission]
):
    grid_path = two_run_grid(repo_root, tmp_path)
    sweep_dir = tmp_path / "sweep"
    launched = subprocess.run(
        [sys.executable, "-m", "sweep.cli", "launch", str(grid_path), "--sweep-dir"]
        + [str(sweep_dir), "--executor", "slurm"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    submitted = [
        Submission.from_json(json.loads(path.read_text()))
        for path in sorted(sweep_dir.glob("runs/*/submitted.json"))
    ]
    slurm_jobs += submitted
    assert launched.returncode == 0, launched.stdout + launched.stderr
    array = submitted[0].job_id.split("_")[0]
    assert launched.stdout.splitlines() == [
        f"chunk 1/1: array {array}, 2 runs (2/2 submitted)",
        "2 runs in grid; submitted 2 via slurm; skipped: none",
        f"sweep folder: {sweep_dir}",
    ]


@pytest.mark.slurm
@pytest.mark.slow
@requires_slurm
@pytest.mark.parametrize("signal_name", ["USR2", "TERM"])
def test_preempted_run_is_requeued_and_resumes_once(
    tmp_path: Path, signal_name: str, slurm_jobs: list[Submission]
):
    (run_dir,) = make_run_dirs(tmp_path, 1)
    executor = _executor(tmp_path, PREEMPTIBLE)
    (sub,) = executor.submit([run_dir], {"run0": 1})
    slurm_jobs.append(sub)
    wait_until(lambda: (run_dir / "started").exists(), STATE_TIMEOUT_S, "first start")

    # What SLURM does before a time limit (--signal=USR2@90) or on preemption (TERM).
    subprocess.run(["scancel", f"--signal={signal_name}", sub.job_id], check=True)
    wait_until(lambda: (run_dir / "done").exists(), 90, "the requeued run to finish")
    wait_until(lambda: _query_one(executor, sub) == "gone", STATE_TIMEOUT_S, "job end")

    assert (run_dir / "starts").read_text().split() == ["0", "1"], "one requeue, same job"
    assert (run_dir / "done").read_text() == "x", "the run finished exactly once"
    wait_until(lambda: _sacct_state(sub.job_id) == "COMPLETED", 30, "sacct COMPLETED")


@pytest.mark.slurm
@pytest.mark.slow
@requires_slurm
def test_query_falls_back_to_squeue_without_accounting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slurm_jobs: list[Submission]
):
    _fake_bin(
        tmp_path,
        monkeypatch,
        {"sacct": "echo 'Slurm accounting storage is disabled' >&2; exit 1"},
    )
    (run_dir,) = make_run_dirs(tmp_path, 1)
    executor = _executor(tmp_path, HELD)
    (sub,) = executor.submit([run_dir], {})
    slurm_jobs.append(sub)
    wait_until(lambda: _query_one(executor, sub) == "running", STATE_TIMEOUT_S, "running")

    (run_dir / "release").write_text("x")
    wait_until(lambda: _query_one(executor, sub) == "gone", STATE_TIMEOUT_S, "gone via squeue")
    purged = Submission("old", "slurm", "99999999_0", 1)
    assert executor.query([purged]) == {"old": "gone"}


@pytest.mark.slurm
@pytest.mark.slow
@requires_slurm
def test_real_entry_point_trains_runs_on_slurm(
    tmp_path: Path, repo_root: Path, slurm_jobs: list[Submission]
):
    from sweep.launch import LaunchOptions, launch
    from sweep.reconcile import current_records
    from sweep.store import SweepStore

    grid_path = two_run_grid(repo_root, tmp_path)
    sweep_dir = tmp_path / "sweep"

    chunks: list[ChunkSubmitted] = []
    first = launch(
        grid_path,
        sweep_dir,
        LaunchOptions(LaunchSettings(executor="slurm"), on_chunk=chunks.append),
    )
    slurm_jobs += first.submissions
    assert len(first.submissions) == 2
    array = first.submissions[0].job_id.split("_")[0]
    assert chunks == [ChunkSubmitted(1, 1, array, 2, 2, 2)]
    store = SweepStore(sweep_dir)
    wait_until(
        lambda: [r.state for r in current_records(store)] == ["done", "done"],
        180,
        "both runs done via python -m sweep.run",
    )
    for record in store.records():
        assert record.step == record.total_steps > 0
        assert (record.run_dir / "logs" / "attempt-1.out").exists()
    again = launch(grid_path, sweep_dir, LaunchOptions(LaunchSettings(executor="slurm")))
    assert again.submissions == [], "a finished sweep must not be resubmitted"
