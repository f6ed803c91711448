"""Executors own their differences: the registry, the traits callers ask instead of names,
query/cancel through pids, and one LaunchSettings for every command that launches."""

from __future__ import annotations

import ast
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runfolder.records import Submission
from sweep.cli import app
from sweep.errors import GridError
from sweep.executors.local import LocalExecutor
from sweep.executors.ray_exec import RayExecutor
from sweep.executors.registry import (
    executor_choices,
    executor_class,
    executor_names,
    register,
    resolve_executor_name,
)
from sweep.grid import LaunchSettings, expand_grid, load_grid
from sweep.store import SweepStore

ROOT = Path(__file__).resolve().parents[1]
# Code outside sweep/executors/ names no executor: it asks the registry's classes.
SCANNED = ("sweep", "models", "analysis", "runfolder", "mx")
# String constants equal to an executor name that are not one: {(file, string): why}.
NOT_EXECUTOR_NAMES = {("sweep/provenance.py", "ray"): "the Ray package, for its version"}


def test_registry_names_choices_and_unknown():
    assert executor_names() == ("local", "slurm", "ray")
    assert executor_choices() == ("auto", "local", "slurm", "ray")
    assert executor_class("ray") is RayExecutor and executor_class("local").name == "local"
    with pytest.raises(GridError, match=r"unknown executor 'k8s'; allowed: auto, local, slurm"):
        executor_class("k8s")
    with pytest.raises(ValueError, match="'local' is taken"):
        register("local")(type("Other", (LocalExecutor,), {}))
    # The order does not depend on which executor module was imported first.
    first_slurm = "import sweep.executors.slurm; from sweep.executors import registry as r; "
    printed = subprocess.run(
        [sys.executable, "-c", first_slurm + "print(r.executor_names())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert printed.strip() == "('local', 'slurm', 'ray')"


def test_traits_tell_the_executors_apart():
    local, slurm, ray = (executor_class(name) for name in ("local", "slurm", "ray"))
    assert local.waits_for_runs and ray.waits_for_runs and not slurm.waits_for_runs
    assert slurm.writes_journal and not local.writes_journal and not ray.writes_journal
    assert local.tracks_pids and ray.tracks_pids and not slurm.tracks_pids


def test_auto_picks_slurm_only_where_sbatch_is(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve_executor_name("auto") == "local"
    sbatch = tmp_path / "sbatch"
    sbatch.write_text("#!/bin/sh\nexit 0\n")
    sbatch.chmod(0o755)
    assert resolve_executor_name("auto") == "slurm"
    assert resolve_executor_name("ray") == "ray"


def test_grid_launch_executor_allows_the_registered_names():
    assert LaunchSettings(executor="ray").executor == "ray"
    schema = LaunchSettings.model_json_schema()["properties"]["executor"]
    assert schema["enum"] == list(executor_choices())
    with pytest.raises(ValueError, match="Input should be 'auto', 'local', 'slurm' or 'ray'"):
        LaunchSettings(executor="k8s")


def _executor_names_in(path: Path) -> list[tuple[int, str]]:
    names = set(executor_names())
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and node.value in names:
            found.append((node.lineno, node.value))
    return found


def test_no_executor_name_outside_the_executors():
    offenders = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("sweep/executors/"):
                continue
            for line, name in _executor_names_in(path):
                if (rel, name) not in NOT_EXECUTOR_NAMES:
                    offenders.append(f"{rel}:{line}: {name!r}")
    assert offenders == [], "ask the executor class (sweep.executors.registry) instead"


def test_the_scan_finds_a_name_branch(tmp_path):
    code = tmp_path / "caller.py"
    code.write_text('if executor == "slurm":\n    pass\nprint("slurm partition")\n')
    assert _executor_names_in(code) == [(1, "slurm")]


# --- query and cancel through pids ----------------------------------------------------


def _run_folder(sweep_dir: Path, run_id: str, marker=None, submitted=None) -> Path:
    run_dir = sweep_dir / "runs" / run_id
    run_dir.mkdir(parents=True)
    for name, payload in (("state", marker), ("submitted", submitted)):
        if payload is not None:
            (run_dir / f"{name}.json").write_text(json.dumps(payload))
    return run_dir


@pytest.fixture
def sleeper():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def test_local_query_and_cancel_through_pids(tmp_path, sleeper):
    here = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    running = {"state": "running", "attempt": 1, "host": here, "pid": sleeper.pid}
    _run_folder(tmp_path, "alive", running)
    _run_folder(tmp_path, "ended", {**running, "pid": dead.pid})
    # Not started yet: the launcher's pid (submitted.json) says whether it still holds it.
    _run_folder(tmp_path, "waiting", submitted={"host": here, "pid": sleeper.pid})
    _run_folder(tmp_path, "orphan", submitted={"host": here, "pid": dead.pid})
    _run_folder(tmp_path, "elsewhere", {**running, "host": "node7"})
    # An older attempt's process is not this attempt's.
    _run_folder(tmp_path, "resubmitted", running, {"host": here, "pid": dead.pid})
    subs = {
        run: Submission(run, "local", None, 2 if run == "resubmitted" else 1)
        for run in ("alive", "ended", "waiting", "orphan", "elsewhere", "resubmitted")
    }
    executor = LocalExecutor.for_sweep(tmp_path)
    assert executor.query(list(subs.values())) == {
        "alive": "running",
        "ended": "gone",
        "waiting": "queued",
        "orphan": "gone",
        "resubmitted": "gone",
    }
    # Only the started run of this host is signalled, and SIGTERM (it would checkpoint).
    executor.cancel([subs["resubmitted"], subs["elsewhere"]])
    assert sleeper.poll() is None
    executor.cancel([subs["alive"]])
    assert sleeper.wait(timeout=10) == -15
    assert executor.query([subs["alive"]]) == {"alive": "gone"}


def test_local_cancel_kill_is_sigkill(tmp_path, sleeper):
    marker = {"state": "running", "attempt": 1, "host": socket.gethostname(), "pid": sleeper.pid}
    _run_folder(tmp_path, "hung", marker)
    LocalExecutor.for_sweep(tmp_path).cancel([Submission("hung", "local", None, 1)], kill=True)
    assert sleeper.wait(timeout=10) == -9


def test_ray_query_of_another_launch_goes_through_pids(tmp_path, sleeper):
    marker = {"state": "running", "attempt": 1, "host": socket.gethostname(), "pid": sleeper.pid}
    _run_folder(tmp_path, "trial", marker)
    sub = Submission("trial", "ray", "t1", 1)
    assert RayExecutor.for_sweep(tmp_path).query([sub]) == {"trial": "running"}
    RayExecutor.for_sweep(tmp_path).cancel([sub])
    assert sleeper.wait(timeout=10) == -15


# --- one LaunchSettings: `sweep intervene` takes every launch setting -----------------


def _fake_slurm(bin_dir: Path, scripts: Path) -> None:
    """sbatch keeps each batch script and accepts it; the controller answers UP; no sinfo
    (preflight then leaves the partition/account to the cluster)."""
    bin_dir.mkdir()
    fakes = {
        "sbatch": f'cp "$1" {scripts}/$(date +%s%N).sh\necho "Submitted batch job 4242"',
        "scontrol": 'case "$1" in ping) echo "Slurmctld(primary) at x is UP";; '
        'show) echo "MaxArraySize = 1001";; esac',
        "sinfo": "exit 1",
        "squeue": "exit 0",
    }
    for name, body in fakes.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)


def test_intervene_passes_account_qos_and_array_parallelism(tmp_path, monkeypatch):
    grid_path = ROOT / "tests" / "grids" / "micro.yaml"
    parent = expand_grid(load_grid(grid_path), grid_path).runs[0]
    store = SweepStore(tmp_path / "sweep")
    store.initialise(grid_path.read_text(), [parent.run_id], update_grid=False)
    store.write_spec(parent.run_id, parent.model_dump_json())
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    _fake_slurm(tmp_path / "bin", scripts)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    args = ["intervene", parent.run_id, "--at", "3", "--sweep-dir", str(store.root)]
    args += ["--arms", "control,rceil,full_precision", "--executor", "slurm"]
    args += ["--partition", "debug", "--account", "proj1", "--qos", "high"]
    args += ["--array-parallelism", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "submitted 3 run(s) via slurm" in result.output
    (script,) = [p.read_text() for p in scripts.iterdir()]
    sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(.*))?$", script, re.MULTILINE))
    assert sbatch["account"] == "proj1" and sbatch["qos"] == "high"
    assert sbatch["partition"] == "debug" and sbatch["array"] == "0-2%2"
    submitted = [json.loads(path.read_text()) for path in store.runs_dir.glob("*/submitted.json")]
    assert sorted(s["job_id"] for s in submitted) == ["4242_0", "4242_1", "4242_2"]


def test_a_bad_launch_flag_exits_2_naming_it(tmp_path):
    result = CliRunner().invoke(
        app,
        ["intervene", "x", "--at", "3", "--sweep-dir", str(tmp_path), "--workers", "0"],
    )
    assert result.exit_code == 2
    assert "--workers 0: Input should be greater than 0" in result.output
