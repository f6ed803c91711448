"""Fake run commands and helpers shared by the SLURM and Ray executor tests."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml


def ci_is_set() -> bool:
    """CI set to anything truthy ("true", "1", "yes", ...): a cluster is promised there."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


# CI brings a cluster up (.ci/run): there a missing SLURM fails the tests instead of
# skipping them (the `slurm_required` fixture of conftest.py).
requires_slurm = pytest.mark.usefixtures("slurm_required")

# Each script gets the run folder as argv[1] and leaves markers in it.
QUICK = """
import pathlib, sys
d = pathlib.Path(sys.argv[1])
print("ran", d.name)
with open(d / "done", "a") as f:
    f.write("x")
"""

# Runs until the test creates <run_dir>/release, so the test decides when it ends.
# Every start appends to <run_dir>/started.
HELD = """
import pathlib, sys, time
d = pathlib.Path(sys.argv[1])
with open(d / "started", "a") as f:
    f.write("x")
while not (d / "release").exists():
    time.sleep(0.1)
with open(d / "done", "a") as f:
    f.write("x")
"""

# Exits with code 3: the command failed.
FAILING = """
import sys
print("boom", file=sys.stderr)
sys.exit(3)
"""

# Like a real run: on SIGTERM/SIGUSR2 it "checkpoints" and exits 75; a restart with a
# checkpoint finishes at once. Every start appends SLURM_RESTART_COUNT to <run_dir>/starts.
PREEMPTIBLE = """
import os, pathlib, signal, sys, time
d = pathlib.Path(sys.argv[1])
with open(d / "starts", "a") as f:
    f.write(os.environ.get("SLURM_RESTART_COUNT", "0") + "\\n")
if (d / "checkpoint").exists():
    with open(d / "done", "a") as f:
        f.write("x")
    sys.exit(0)
def stop(signum, frame):
    # SLURM and the array task both deliver the signal: ignore the second copy.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    (d / "checkpoint").write_text(str(signum))
    sys.exit(75)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGUSR2, stop)
(d / "started").write_text("x")
while True:
    time.sleep(0.1)
"""


def fake_command(script: str) -> Callable[[Path], list[str]]:
    """A `command` for executors that runs `script` with the run folder as argv[1]."""
    return lambda run_dir: [sys.executable, "-c", script, str(run_dir)]


def make_run_dirs(root: Path, count: int, prefix: str = "run") -> list[Path]:
    """Create `count` empty run folders under root/runs."""
    dirs = [root / "runs" / f"{prefix}{i}" for i in range(count)]
    for run_dir in dirs:
        run_dir.mkdir(parents=True)
    return dirs


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll predicate every 0.25 s; fail the test with `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.25)


def two_run_grid(repo_root: Path, tmp_path: Path) -> Path:
    """tests/grids/micro.yaml cut to one budget and one shape: two runs, two precisions."""
    grid = yaml.safe_load((repo_root / "tests" / "grids" / "micro.yaml").read_text())
    grid["axes"]["budget"] = grid["axes"]["budget"][:1]
    grid["axes"]["shape"] = grid["axes"]["shape"][:1]
    grid_path = tmp_path / "two_runs.yaml"
    grid_path.write_text(yaml.safe_dump(grid))
    return grid_path
