"""Write-ahead journal, task guard, fault hook and partial run folders, without a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runfolder.atomic import atomic_write_json
from runfolder.records import Submission
from sweep.executors.guard import check
from sweep.executors.slurm import run_answer
from sweep.journal import Journal, intent_path, remove_stray_files, resolve_open
from sweep.status import main as status_main
from sweep.store import SweepStore


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _store(tmp_path: Path, run_ids: list[str]) -> SweepStore:
    store = SweepStore(tmp_path / "sweep")
    store.initialise("name: t\n", run_ids, update_grid=False)
    return store


def _spec(steps: int = 40) -> str:
    return json.dumps({"train": {"steps": steps}, "tags": {"config": "c"}, "seed": 0})


def test_accepted_intent_is_adopted_and_never_over_a_newer_submission(tmp_path: Path):
    store = _store(tmp_path, ["a", "b", "c"])
    journal = Journal(store)
    token = journal.open([("a", 1), ("b", 1), ("c", 2)], 1, 1)
    intent = json.loads(intent_path(store.root, token).read_text())
    # Killed after sbatch, after the job ids and one submitted.json were recorded.
    intent.update(state="accepted", job_ids=["7_0", "7_1", "7_2"], pid=_dead_pid())
    atomic_write_json(intent_path(store.root, token), intent)
    store.record_submission(Submission("a", "slurm", "7_0", 1, token=token))
    newer = Submission("c", "slurm", "9", 3, token="later")
    store.record_submission(newer)

    resolution = resolve_open(store, strict=True)

    assert resolution.adopted == [token] and resolution.cancelled_jobs == []
    subs = {r.run_id: r.submission for r in store.records()}
    assert (subs["b"].job_id, subs["b"].token, subs["b"].attempt) == ("7_1", token, 1)
    assert (subs["c"].job_id, subs["c"].token) == ("9", "later"), "a newer one stays"
    assert json.loads(intent_path(store.root, token).read_text())["state"] == "adopted"
    assert resolve_open(store, strict=True).adopted == [], "settled once"


def test_open_intent_without_an_answering_squeue_blocks_a_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = _store(tmp_path, ["a"])
    Journal(store).open([("a", 1)], 1, 1)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no squeue at all
    with pytest.raises(Exception, match="squeue does not answer"):
        resolve_open(store, strict=True)
    assert resolve_open(store, strict=False).cancelled_jobs == []
    assert len(Journal(store).unsettled()) == 1, "left for the next launch"


def test_guard_lets_only_the_current_submission_train(tmp_path: Path):
    store = _store(tmp_path, ["a", "b"])
    journal = Journal(store)
    token = journal.open([("a", 1), ("b", 1)], 1, 1)
    path = intent_path(store.root, token)
    store.record_submission(Submission("a", "slurm", "5_0", 1, token=token))
    assert check(path, 0) is None
    # Run b has no submitted.json and its launcher is gone: an orphan, at once.
    intent = json.loads(path.read_text())
    intent["pid"] = _dead_pid()
    atomic_write_json(path, intent)
    started = time.monotonic()
    reason = check(path, 1)
    assert reason is not None and "orphan task" in reason and "run b" in reason
    assert time.monotonic() - started < 2
    # A later submission replaced a's: this job is stale even with its launcher alive.
    store.record_submission(Submission("a", "slurm", "8_0", 2, token="newer"))
    intent["pid"] = os.getpid()
    atomic_write_json(path, intent)
    assert "current submission is newer" in check(path, 0, wait_s=0.5)


def test_the_run_itself_refuses_a_foreign_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from sweep.run import execute

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text("{not even json")  # never read: the check comes first
    atomic_write_json(
        run_dir / "submitted.json", {"executor": "slurm", "attempt": 2, "token": "t2"}
    )
    monkeypatch.setenv("MXSCALE_SUBMISSION", "t1")
    monkeypatch.setenv("MXSCALE_ATTEMPT", "1")
    assert execute(run_dir) == 0
    assert not (run_dir / "state.json").exists()


def test_stray_submitit_files_of_cancelled_jobs_are_removed(tmp_path: Path):
    folder = tmp_path / "slurm"
    folder.mkdir()
    names = ["0" * 32 + ".pkl", "12_0_submitted.pkl", "13_0_submitted.pkl", "12_0_log.out"]
    for name in names:
        (folder / name).write_text("x")
    assert remove_stray_files(tmp_path, ["12"]) == 2
    assert sorted(p.name for p in folder.iterdir()) == ["12_0_log.out", "13_0_submitted.pkl"]


@pytest.mark.parametrize(
    ("slurm", "answer"),
    [
        ("CANCELLED by 0", "cancelled"),
        ("PREEMPTED", "gone"),
        ("TIMEOUT", "gone"),
        ("RUNNING", "running"),
    ],
)
def test_a_users_scancel_is_a_cancellation_preemption_is_not(slurm: str, answer: str):
    assert run_answer(slurm) == answer


def test_fault_hook_kills_at_the_named_pass(tmp_path: Path):
    code = (
        "from sweep import faults\n"
        "for _ in range(3):\n"
        "    faults.passed('spec')\n"
        "    print('spec', flush=True)\n"
    )
    env = {**os.environ, "SWEEP_KILL_AT": "spec-2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == -9 and proc.stdout.split() == ["spec"]


def test_status_reads_every_partial_state_a_killed_writer_leaves(
    tmp_path: Path, capsys: pytest.CaptureFixture
):
    ids = ["no_folder", "spec_only", "no_spec", "bad_submitted", "cut_state", "ckpt"]
    store = _store(tmp_path, ids)
    for run_id in ids[1:]:
        store.write_spec(run_id, _spec())
    (store.runs_dir / "no_spec" / "spec.json").unlink()
    store.record_submission(Submission("no_spec", "local", None, 1))
    (store.runs_dir / "bad_submitted" / "submitted.json").write_text('{"run_id": "bad_sub')
    (store.runs_dir / "cut_state" / "state.json").write_text('{"state": "runn')
    (store.runs_dir / "cut_state" / "summary.json").write_text("[]")
    # Killed at step 170 with its newest checkpoint at 150: it resumes from 150.
    ckpt = store.runs_dir / "ckpt"
    (ckpt / "checkpoints").mkdir()
    (ckpt / "checkpoints" / "step-000000150.pt").write_text("")
    host = os.uname().nodename
    marker = {"state": "running", "step": 170, "attempt": 1, "heartbeat": 0.0, "host": host}
    atomic_write_json(ckpt / "state.json", {**marker, "pid": _dead_pid()})
    store.record_submission(Submission("ckpt", "local", None, 1))

    assert status_main([str(store.root), "--json"]) == 0
    rows = {row["run_id"]: row for row in json.loads(capsys.readouterr().out)["runs"]}
    states = {run_id: row["state"] for run_id, row in rows.items()}
    assert states == {
        "no_folder": "pending",
        "spec_only": "pending",
        "no_spec": "incomplete",
        "bad_submitted": "pending",
        "cut_state": "pending",
        "ckpt": "stale",
    }
    assert rows["no_folder"]["total_steps"] == 0 and rows["spec_only"]["total_steps"] == 40
    assert rows["ckpt"]["step"] == 150
    assert status_main([str(store.root)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    # A relaunch writes the missing specs (and rewrites an unreadable one).
    (store.runs_dir / "spec_only" / "spec.json").write_text('{"tra')
    for run_id in ids:
        store.write_spec(run_id, _spec(7))
    assert [r.total_steps for r in store.records()] == [40, 40, 40, 7, 7, 7]


def test_runs_of_a_killed_ray_driver_are_stale_not_queued():
    from sweep.store import derive_state

    host = os.uname().nodename
    submitted = {"executor": "ray", "attempt": 1, "host": host, "pid": _dead_pid()}
    assert derive_state(None, submitted, None, time.time()) == "stale"
    assert derive_state(None, {**submitted, "pid": os.getpid()}, None, time.time()) == "queued"
