"""The small interface every executor implements and the traits it declares (its
Submission record: runfolder.records)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from runfolder.records import Submission
from sweep.errors import GridError

if TYPE_CHECKING:
    from models.config import RunSpec
    from sweep.grid import LaunchSettings

_PR_SET_PDEATHSIG = 1

# What the scheduler can tell about a submitted run; run markers say the rest.
SCHEDULER_STATES = ("queued", "running", "gone", "cancelled", "unknown")
# What a job passes to the run it starts: its submission token and attempt, which the run
# checks against submitted.json before training (sweep.journal).
TOKEN_ENV = "MXSCALE_SUBMISSION"
ATTEMPT_ENV = "MXSCALE_ATTEMPT"


class Executor(Protocol):
    """Submit run folders, ask the scheduler about them, cancel them."""

    name: str

    def submit(self, run_dirs: list[Path], attempts: dict[str, int]) -> list[Submission]:
        """Start (or queue) each run folder; return one Submission per run."""

    def query(self, submissions: list[Submission]) -> dict[str, str]:
        """Map run_id to one of SCHEDULER_STATES for runs the scheduler may still hold."""

    def cancel(self, submissions: list[Submission], *, kill: bool = False) -> None:
        """Stop these runs if queued or running (``kill``: at once, without a checkpoint)."""


class BaseExecutor:
    """What every registered executor tells its callers about itself, and the hooks they
    call; subclasses set the traits and override the hooks that differ."""

    name: ClassVar[str]  # set by sweep.executors.registry.register
    # submit returns once every run has ended (the launch knows their outcomes, retries
    # crashes at once and shows a bar of runs); False: it returns once they are queued.
    waits_for_runs: ClassVar[bool] = True
    # Each chunk's submission is recorded write-ahead (sweep.journal), since its jobs
    # outlive the launcher; otherwise submitted.json is written before the blocking submit.
    writes_journal: ClassVar[bool] = False
    # The runs are processes of the launching host: their pids in the run folder say
    # whether they live (no scheduler holds them that another process could ask).
    tracks_pids: ClassVar[bool] = True
    # Picked by ``--executor auto`` when detected, lowest first; None: never picked.
    auto_priority: ClassVar[int | None] = None
    auto_when: ClassVar[str] = ""  # when auto picks it, for the help: " if sbatch exists"

    @classmethod
    def detected(cls) -> bool:
        """Whether this executor can run here (for ``auto``)."""
        return True

    @classmethod
    def for_launch(
        cls,
        sweep_dir: Path,
        settings: LaunchSettings,
        specs: list[RunSpec],
        hooks: LaunchHooks,
    ) -> Executor:
        """The executor a launch submits ``specs`` through, sized for the largest of them."""
        raise NotImplementedError

    @classmethod
    def for_sweep(cls, sweep_dir: Path) -> Executor:
        """An executor that can query and cancel the sweep's earlier submissions."""
        raise NotImplementedError

    @classmethod
    def run_states(cls, sweep_dir: Path, submissions: list[Submission]) -> dict[str, str]:
        """What a scheduler says of these runs for ``sweep status`` ({run_id: one of
        SCHEDULER_STATES}); {} when no scheduler holds them or none answers. Runs that are
        processes of this host (``tracks_pids``): {}, the pids in their files decide."""
        return {}

    @classmethod
    def final_outcomes(cls, submissions: list[Submission]) -> dict[str, tuple[str, str]]:
        """{run_id: (final scheduler state, exit code)} of ended runs, for triage; {} when
        there is no scheduler to ask."""
        return {}

    @classmethod
    def check_specs(cls, source: str, specs: list[RunSpec]) -> None:
        """Refuse runs this executor cannot place (GridError), before anything is written."""

    @classmethod
    def check_cluster(cls, source: str, specs: list[RunSpec], settings: LaunchSettings) -> None:
        """Refuse a launch the cluster would reject (GridError); may ask the cluster."""


@dataclass(frozen=True)
class LaunchHooks:
    """Callbacks a launch hands its executor: each run's end (executors that wait for their
    runs) and each array chunk sbatch accepted (SLURM)."""

    on_event: Callable[[str, str, Any], None] | None = None
    on_chunk: Callable[[Any], None] | None = None


def check_fits_cores(source: str, specs: list[RunSpec]) -> None:
    """Refuse runs asking for more cores (cpus x tasks_per_node) than this machine has."""
    cores = os.cpu_count() or 1
    for spec in specs:
        if spec.resources.cpus * spec.resources.tasks_per_node > cores:
            raise GridError(
                f"{source}: run {spec.run_id} asks for resources.cpus="
                f"{spec.resources.cpus} x tasks_per_node={spec.resources.tasks_per_node} "
                f"but this machine has {cores} cores"
            )


def cpus_per_run(specs: list[RunSpec]) -> int:
    """Cores the largest run takes: a run of several processes takes cores for each."""
    return max(spec.resources.cpus * spec.resources.tasks_per_node for spec in specs)


def run_command(run_dir: Path) -> list[str]:
    """The single entry point every executor runs for a run folder."""
    return [sys.executable, "-m", "sweep.run", str(run_dir)]


def die_with_parent() -> None:
    """``preexec_fn`` for a child that must not outlive its launcher (e.g. after SIGKILL)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
