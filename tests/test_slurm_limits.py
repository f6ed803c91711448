"""Submission limits (MaxArraySize, MaxJobCount, MaxSubmitJobs) and sbatch retries: pure
logic always; waves under a real MaxSubmitJobs and a flaky sbatch against the real SLURM."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from executor_fixtures import QUICK, fake_command, make_run_dirs, requires_slurm, wait_until

from sweep.errors import SweepError
from sweep.executors import slurm_limits
from sweep.executors.slurm import SlurmExecutor
from sweep.executors.slurm_limits import (
    Limit,
    SbatchGaveUpError,
    SubmitLimits,
    backoff_s,
    is_retryable,
    submit_chunk,
    waves,
)
from sweep.journal import Journal, resolve_open
from sweep.store import SweepStore

TIMEOUT_MSG = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"
CONNECT_MSG = (
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
    "(connect failure)"
)
RUN_TIMEOUT_S = 240


def test_limits_count_the_jobs_they_cap():
    queue = [("me", "a", "normal")] * 3 + [("me", "b", "high")] + [("you", "a", "normal")] * 2
    assert Limit("assoc", 5, user="me", account="a").used(queue) == 3
    assert Limit("qos per user", 9, user="me", qos="normal").used(queue) == 3
    assert Limit("qos per account", 9, account="a", qos="normal").used(queue) == 5
    assert Limit("controller", 100).used(queue) == 6
    limits = SubmitLimits(1001, (Limit("controller", 100), Limit("assoc", 5, "me", "a")))
    room, binding = limits.room(queue)
    assert (room, binding.name) == (2, "assoc")
    # A limit already exceeded (someone else submitted) leaves no room, never negative.
    assert SubmitLimits(1001, (Limit("assoc", 2, "me"),)).room(queue)[0] == 0


def _fake_queue(monkeypatch: pytest.MonkeyPatch, sizes: list[int]) -> None:
    """queued_jobs answers the next size of ``sizes`` on each call (our user's jobs)."""
    answers = iter(sizes)
    monkeypatch.setattr(slurm_limits, "queued_jobs", lambda: [("me", "", "")] * next(answers))


def test_waves_fit_array_size_and_room(monkeypatch: pytest.MonkeyPatch):
    # Room 4 at first (1 of 5 queued), then full twice (a wait), then empty.
    _fake_queue(monkeypatch, [1, 5, 5, 0, 0, 0])
    limits = SubmitLimits(4, (Limit("MaxSubmitJobs of association x/me", 5, "me"),))
    messages: list[str] = []
    out = list(waves([("a", list(range(7))), ("b", [7, 8])], limits, messages.append, poll_s=0))
    assert [(key, chunk) for key, chunk, _ in out] == [
        ("a", [0, 1, 2]),  # MaxArraySize 4: three tasks; room was 4
        ("a", [3, 4, 5]),  # after the wait: room 5, array cap 3
        ("a", [6]),
        ("b", [7, 8]),
    ]
    assert [estimate for _, _, estimate in out] == [4, 4, 4, 4]
    assert len(messages) == 2, messages
    assert "MaxSubmitJobs of association x/me = 5 reached" in messages[0]
    assert "6 run(s) left to submit" in messages[0]  # of 9
    assert "room for 5" in messages[1]


def test_waves_without_caps_need_no_squeue(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(slurm_limits, "queued_jobs", lambda: pytest.fail("squeue asked"))
    out = list(waves([(None, list(range(5)))], SubmitLimits(3)))
    assert [chunk for _, chunk, _ in out] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="max_array_size must be >= 2"):
        list(waves([(None, [1])], SubmitLimits(1)))


def test_only_the_transient_sbatch_errors_are_retried():
    assert is_retryable(RuntimeError(TIMEOUT_MSG))
    assert is_retryable(RuntimeError(CONNECT_MSG))
    assert not is_retryable(RuntimeError("sbatch: error: invalid partition specified: gpu"))
    assert [backoff_s(n) for n in range(1, 8)] == [2, 4, 8, 16, 32, 60, 60]


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Journal, list]:
    """A journal, and the job lists cancel_jobs was called with."""
    cancelled: list[list[str]] = []
    # A controller that answers: one ghost job carries the first failed try's token.
    monkeypatch.setattr(
        "sweep.executors.slurm.jobs_by_comment",
        lambda prefix: {prefix: ["99"]} if not cancelled else {},
    )
    monkeypatch.setattr("sweep.executors.slurm.cancel_jobs", cancelled.append)
    return Journal(SweepStore(tmp_path / "sweep")), cancelled


def _intents(journal: Journal) -> list[dict]:
    folder = journal.store.root / "submissions"
    found = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    return sorted(found, key=lambda i: i["created_at"])


def test_a_timed_out_sbatch_is_retried_under_a_fresh_token(journal):
    journal, cancelled = journal
    tokens: list[str] = []
    sleeps: list[float] = []
    messages: list[str] = []

    def sbatch(token: str) -> str:
        tokens.append(token)
        if len(tokens) < 3:
            raise RuntimeError(TIMEOUT_MSG)
        return "jobs"

    token, jobs = submit_chunk(
        journal,
        [("r0", 1)],
        1,
        1,
        sbatch,
        journal.store.root,
        report=messages.append,
        sleep=sleeps.append,
    )
    assert (token, jobs) == (tokens[-1], "jobs")
    assert len(set(tokens)) == 3 and sleeps == [2.0, 4.0]
    # The ghost of the first try was cancelled; the intents say what happened to each try.
    assert cancelled == [["99"], []]
    states = [(i["token"], i["state"], i.get("cancelled_jobs")) for i in _intents(journal)]
    assert states == [
        (tokens[0], "cancelled", ["99"]),
        (tokens[1], "cancelled", []),
        (tokens[2], "open", None),
    ]
    assert "try 2 of 5 in 2 s" in messages[0] and "Socket timed out" in messages[0]


def test_sbatch_gives_up_after_the_bounded_tries(journal):
    journal, _ = journal
    calls: list[str] = []

    def sbatch(token: str) -> str:
        calls.append(token)
        raise RuntimeError(CONNECT_MSG)

    with pytest.raises(SbatchGaveUpError, match="failed 3 times") as caught:
        submit_chunk(
            journal,
            [("r0", 1)],
            2,
            4,
            sbatch,
            journal.store.root,
            tries=3,
            report=lambda _: None,
            sleep=lambda _: None,
        )
    assert isinstance(caught.value, SweepError)  # the CLI says it in one line, exit 2
    assert len(calls) == 3
    assert {i["state"] for i in _intents(journal)} == {"cancelled"}
    # Nothing is left for the next launch to settle, and no run is tracked as submitted.
    assert journal.unsettled() == []
    assert not (journal.store.runs_dir / "r0" / "submitted.json").exists()


def test_a_final_sbatch_error_is_not_retried(journal):
    journal, _ = journal
    calls: list[str] = []

    def sbatch(token: str) -> str:
        calls.append(token)
        raise RuntimeError("sbatch: error: invalid partition specified: gpu")

    with pytest.raises(RuntimeError, match="invalid partition"):
        submit_chunk(
            journal,
            [("r0", 1)],
            1,
            1,
            sbatch,
            journal.store.root,
            report=lambda _: None,
            sleep=lambda _: None,
        )
    assert len(calls) == 1
    assert [i["state"] for i in _intents(journal)] == ["failed"]


def test_an_unanswered_lookup_leaves_the_intent_for_the_next_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("sweep.executors.slurm.jobs_by_comment", lambda prefix: None)
    journal = Journal(SweepStore(tmp_path / "sweep"))
    answers = iter([RuntimeError(TIMEOUT_MSG), "jobs"])

    def sbatch(token: str) -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    messages: list[str] = []
    submit_chunk(
        journal,
        [("r0", 1)],
        1,
        1,
        sbatch,
        journal.store.root,
        report=messages.append,
        sleep=lambda _: None,
    )
    # The first try may have queued an array: its intent stays open, so a launch that
    # cannot ask squeue refuses to go on, and one that can cancels what carries its token.
    assert [i["state"] for i in _intents(journal)] == ["open", "open"]
    assert "cancelled by the next launch" in messages[0]
    with pytest.raises(SweepError, match="squeue does not answer"):
        resolve_open(journal.store, strict=True)


# -- against the real SLURM -------------------------------------------------------------


def _set_max_submit(value: int) -> None:
    subprocess.run(
        [
            "sacctmgr",
            "-i",
            "modify",
            "user",
            "where",
            f"name={getpass.getuser()}",
            "set",
            f"MaxSubmitJobs={value}",
        ],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def max_submit_3() -> Iterator[None]:
    """MaxSubmitJobs=3 on the user's association for the test, removed afterwards."""
    _set_max_submit(3)
    try:
        yield
    finally:
        _set_max_submit(-1)


def _our_jobs(name: str) -> int:
    out = subprocess.run(
        ["squeue", "-h", "-r", "-n", name, "-o", "%i"], capture_output=True, text=True
    )
    return len(out.stdout.split())


@pytest.mark.slurm
@pytest.mark.slow
@requires_slurm
def test_launch_beyond_max_submit_jobs_goes_in_waves(
    tmp_path: Path, max_submit_3: None, monkeypatch: pytest.MonkeyPatch, capsys
):
    if shutil.which("sacctmgr") is None:
        pytest.skip("no accounting here")
    monkeypatch.setattr(slurm_limits, "WAIT_POLL_S", 0.5)
    store = SweepStore(tmp_path / "sweep")
    runs = make_run_dirs(store.root, 7)
    executor = SlurmExecutor(store.root, time_min=5, command=fake_command(QUICK))
    name = executor.parameters["job_name"]
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _our_jobs(name))
            stop.wait(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        try:
            with store.lock():
                subs = executor.submit(runs, {}, Journal(store))
        finally:
            stop.set()
            watcher.join()
        wait_until(lambda: all((d / "done").exists() for d in runs), RUN_TIMEOUT_S, "all ran")
    finally:
        subprocess.run(["scancel", "--name", name], check=False)
    assert [s.run_id for s in subs] == [d.name for d in runs]
    assert peak[0] <= 3, f"{peak[0]} jobs queued at once under MaxSubmitJobs=3"
    arrays = {s.job_id.split("_")[0] for s in subs}
    assert len(arrays) >= 3, "7 runs under a limit of 3 need at least three waves"
    err = capsys.readouterr().err
    assert "MaxSubmitJobs of association" in err and "= 3 reached" in err
    assert [(d / "done").read_text() for d in runs] == ["x"] * 7
    intents = [json.loads(p.read_text()) for p in (store.root / "submissions").glob("*.json")]
    assert {i["state"] for i in intents} == {"recorded"}
    assert sum(len(i["runs"]) for i in intents) == 7


@pytest.mark.slurm
@pytest.mark.slow
@requires_slurm
def test_flaky_sbatch_is_retried_and_submits_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
):
    """A fake sbatch first on PATH fails twice with the real timeout message, then runs the
    real one: the chunk is queued once, under the third token."""
    real = shutil.which("sbatch")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    count = tmp_path / "sbatch-calls"
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\n"
        f"echo x >> {count}\n"
        f'if [ "$(wc -l < {count})" -le 2 ]; then echo "{TIMEOUT_MSG}" >&2; exit 1; fi\n'
        f'exec {real} "$@"\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm_limits, "BACKOFF_FIRST_S", 0.05)
    store = SweepStore(tmp_path / "sweep")
    runs = make_run_dirs(store.root, 2)
    executor = SlurmExecutor(store.root, time_min=5, command=fake_command(QUICK))
    try:
        with store.lock():
            subs = executor.submit(runs, {}, Journal(store))
        wait_until(lambda: all((d / "done").exists() for d in runs), RUN_TIMEOUT_S, "runs ran")
    finally:
        subprocess.run(["scancel", "--name", executor.parameters["job_name"]], check=False)
    assert count.read_text().count("x") == 3
    intents = sorted(
        (json.loads(p.read_text()) for p in (store.root / "submissions").glob("*.json")),
        key=lambda i: i["created_at"],
    )
    assert [i["state"] for i in intents] == ["cancelled", "cancelled", "recorded"]
    assert [i["cancelled_jobs"] for i in intents[:2]] == [[], []]
    assert {s.token for s in subs} == {intents[2]["token"]}
    for run_dir in runs:
        submitted = json.loads((run_dir / "submitted.json").read_text())
        assert submitted["token"] == intents[2]["token"]
    assert [(d / "done").read_text() for d in runs] == ["x", "x"]
    assert capsys.readouterr().err.count("Socket timed out on send/recv operation") >= 2
    # No submitit leftovers of the failed tries (the accepted one's script is a link).
    scripts = list((store.root / "slurm").glob(".submission_file_*.sh"))
    assert all(path.is_symlink() for path in scripts), scripts
    assert not [p for p in (store.root / "slurm").glob("*.pkl") if len(p.stem) == 32]
