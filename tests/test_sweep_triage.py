"""`sweep status --failures`: runs grouped by cause; `hung` runs and `sweep cancel --hung`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweep.executors.slurm import parse_sacct
from sweep.store import SweepStore
from sweep.triage import describe_exit, mask

OOM = "RuntimeError: CUDA out of memory. Tried to allocate {} GiB (run {} at /scratch/{}/x.pt)"
# What `sacct -n -P -X -o JobID,State,ExitCode` prints (SLURM 23.x), a requeued task twice.
SACCT = """\
4242_0|OUT_OF_MEMORY|0:125
4242_1|NODE_FAIL|0:0
4242_1|TIMEOUT|0:15
4242_[2-9]|PENDING|0:0
"""


def _run(store: SweepStore, run_id: str, marker=None, submitted=None, summary=None, log=None):
    spec = {"model": {"d_model": 32}, "train": {"steps": 1000}, "tags": {"config": "c"}}
    run_dir = store.write_spec(run_id, json.dumps(spec))
    for name, payload in (("state", marker), ("submitted", submitted), ("summary", summary)):
        if payload is not None:
            (run_dir / f"{name}.json").write_text(json.dumps(payload))
    if log is not None:
        (run_dir / "logs").mkdir()
        (run_dir / "logs" / "attempt-1.log").write_text(log)


@pytest.fixture
def sweep(tmp_path: Path):
    """15 runs: 5 OOM crashes, 2 bad-config crashes, 4 divergences in two step buckets,
    2 SLURM runs gone (OOM kill, timeout), 1 hung local run, 1 done."""
    store = SweepStore(tmp_path / "sweep")
    ids = [f"{i:012x}" for i in range(15)]
    store.initialise("name: t\n", ids, update_grid=False)
    for i in range(5):
        reason = OOM.format(1.5 + i, ids[i], 1000 + i)
        _run(
            store,
            ids[i],
            {"state": "failed", "step": 10 * i, "attempt": 1, "reason": reason},
            log=f"attempt 1: starting\nstep {i}\nTraceback ...\n{reason}\n",
        )
    for i in (5, 6):
        reason = f"ValueError: branching={60 + i} exceeds vocab_size=16"
        _run(store, ids[i], {"state": "failed", "step": 0, "attempt": 1, "reason": reason})
    for i, step in zip((7, 8, 9, 10), (70, 100, 127, 300), strict=True):
        _run(store, ids[i], {"state": "diverged", "step": step}, summary={"diverged_step": step})
    old = time.time() - 4000
    for i, job in ((11, "4242_0"), (12, "4242_1")):
        _run(
            store,
            ids[i],
            {"state": "running", "step": 5, "attempt": 1, "heartbeat": old, "host": "node7"},
            submitted={"run_id": ids[i], "executor": "slurm", "job_id": job, "attempt": 1},
        )
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    marker = {
        "state": "running",
        "step": 42,
        "attempt": 1,
        "heartbeat": old,
        "host": socket.gethostname(),
        "pid": sleeper.pid,
    }
    _run(
        store,
        ids[13],
        marker,
        submitted={"run_id": ids[13], "executor": "local", "job_id": None, "attempt": 1},
    )
    _run(store, ids[14], {"state": "done", "step": 1000})
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    sacct = fake_bin / "sacct"
    sacct.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/sacct.calls\ncat <<'EOF'\n{SACCT}EOF\n")
    sacct.chmod(0o755)
    yield store, ids, sleeper, fake_bin
    sleeper.kill()
    sleeper.wait()


def _sweep(fake_bin: Path, *args: str, module: str = "sweep", flags=()):
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    return subprocess.run(
        [sys.executable, *flags, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_failures_grouped_by_cause_as_json(sweep):
    store, ids, _, fake_bin = sweep
    result = _sweep(fake_bin, "status", str(store.root), "--failures", "--json")
    assert result.returncode == 0, result.stderr
    groups = {(g["state"], g["cause"]): g for g in json.loads(result.stdout)["groups"]}
    oom = groups[
        (
            "failed",
            "RuntimeError: CUDA out of memory. Tried to allocate <n> GiB (run <id> at <path>)",
        )
    ]
    assert oom["count"] == 5 and oom["run_ids"] == ids[:5] and oom["examples"] == ids[:3]
    assert oom["log_tail"][-1].startswith("RuntimeError: CUDA out of memory")
    assert len(oom["log_tail"]) == 4 and oom["log_file"].endswith("attempt-1.log")
    bad = groups[("failed", "ValueError: branching=<n> exceeds vocab_size=<n>")]
    assert bad["count"] == 2 and bad["log_tail"] == []
    assert groups[("diverged", "diverged at step 64-127")]["run_ids"] == ids[7:10]
    assert groups[("diverged", "diverged at step 256-511")]["count"] == 1
    assert groups[("stale", "scheduler OUT_OF_MEMORY, exit signal 125")]["run_ids"] == [ids[11]]
    # The requeued task's last attempt wins: it timed out (signal 15), not the node failure.
    assert groups[("stale", "scheduler TIMEOUT, exit signal 15")]["run_ids"] == [ids[12]]
    hung = groups[("hung", "no progress since step 42 (process alive)")]
    assert hung["run_ids"] == [ids[13]]
    assert len(groups) == 7 and sum(g["count"] for g in groups.values()) == 14
    # Largest group first; sacct asked once for the one array.
    assert json.loads(result.stdout)["groups"][0]["count"] == 5
    calls = (store.root.parent / "sacct.calls").read_text().splitlines()
    assert len(calls) == 1 and calls[0].endswith("-j 4242")


def test_failures_table_and_fast_path(sweep):
    store, ids, _, fake_bin = sweep
    result = _sweep(fake_bin, "status", str(store.root), "--failures", flags=("-X", "importtime"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "14 run(s) in trouble, 7 cause(s)"
    assert lines[1].split()[:3] == ["5", "failed", "RuntimeError:"]
    assert f"e.g. {ids[0]}, {ids[1]}, {ids[2]} (+2 more)" in result.stdout
    assert "| RuntimeError: CUDA out of memory. Tried to allocate 1.5 GiB" in result.stdout
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()}
    assert "sweep.triage" in imported
    assert not {"torch", "pydantic", "typer", "pandas", "numpy", "yaml", "rich"} & imported


def test_hung_state_in_status_and_threshold(sweep):
    store, ids, _, fake_bin = sweep
    result = _sweep(fake_bin, "status", str(store.root), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    states = {row["run_id"]: row["state"] for row in report["runs"]}
    assert states[ids[13]] == "hung" and report["counts"]["hung"] == 1
    # Under a longer threshold the same run is not hung yet (old heartbeat: stale).
    report = json.loads(
        _sweep(fake_bin, "status", str(store.root), "--json", "--hung-after", "9000").stdout
    )
    assert {row["run_id"]: row["state"] for row in report["runs"]}[ids[13]] == "stale"


def test_cancel_hung_kills_only_hung_runs(sweep):
    store, ids, sleeper, fake_bin = sweep
    result = _sweep(
        fake_bin, "cancel", str(store.root), "--hung", "--hung-after", "60", module="sweep.cli"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cancelled 1 run(s)" in result.stdout
    assert sleeper.wait(timeout=10) == -9  # SIGKILL: a hung run never reaches a checkpoint
    marker = json.loads((store.runs_dir / ids[13] / "state.json").read_text())
    assert marker["state"] == "cancelled" and "hung at step 42" in marker["reason"]
    # The stale SLURM runs and everything else are untouched.
    assert json.loads((store.runs_dir / ids[11] / "state.json").read_text())["state"] == "running"


def test_masking_and_exit_words():
    assert mask("IndexError: index 70001 is out of bounds for size 32000") == (
        "IndexError: index <n> is out of bounds for size <n>"
    )
    assert mask("bad fp8_e4m3 in blocks.3.fc1: 1e-3") == "bad fp8_e4m3 in blocks.3.fc1: <n>"
    assert describe_exit("0:9") == "signal 9" and describe_exit("137:0") == "code 137"
    assert parse_sacct("12_3|CANCELLED by 0|0:15\n") == {"12_3": ("CANCELLED", "0:15")}
