"""Ray executor: one Ray Tune trial per run, each calling the run's command in a subprocess.

`submit` blocks until every trial has ended (reporting each end to ``on_event`` as it
happens): Tune needs its driver alive, so by the time `query` or another `sweep` process
asks, the scheduler holds nothing (all runs "gone") and the run folders' own markers tell
how each run ended.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runfolder.records import Submission
from sweep.errors import GridError
from sweep.executors.base import (
    BaseExecutor,
    LaunchHooks,
    check_fits_cores,
    cpus_per_run,
    run_command,
)
from sweep.executors.processes import launch_logged, pid_states, signal_runs, stop_signal
from sweep.executors.registry import register

if TYPE_CHECKING:
    from models.config import RunSpec
    from sweep.grid import LaunchSettings


@dataclass(frozen=True)
class TrialOutcome:
    """How one trial ended: status "done" or "failed" (error holds the reason)."""

    run_id: str
    trial_id: str | None
    status: str
    error: str | None = None


# (event "done" | "failed", run_id, outcome): the local executor's callback signature; the
# outcome is None here, as it is only complete once Tune returns (see RayExecutor.outcomes).
OnEvent = Callable[[str, str, None], None]


def _run_trial(config: dict[str, Any], jobs: dict[str, tuple[list[str], str, int]]) -> None:
    argv, run_dir, attempt = jobs[config["run_id"]]
    returncode = launch_logged(argv, Path(run_dir), attempt).wait()
    if returncode != 0:
        raise RuntimeError(f"{argv[0]} for {run_dir} exited with {returncode}; see its logs/")


@register("ray")
class RayExecutor(BaseExecutor):
    """Run each run folder as a Ray Tune trial on a local Ray or an existing cluster."""

    def __init__(
        self,
        *,
        address: str | None = None,
        num_cpus: int | None = None,
        cpus_per_run: float = 1,
        command: Callable[[Path], list[str]] = run_command,
        on_event: OnEvent | None = None,
        sweep_dir: Path | None = None,
    ) -> None:
        if num_cpus is not None and num_cpus < 1:
            raise ValueError(f"num_cpus must be >= 1, got {num_cpus}")
        if cpus_per_run <= 0:
            raise ValueError(f"cpus_per_run must be > 0, got {cpus_per_run}")
        if address is not None and num_cpus is not None:
            raise ValueError("num_cpus only applies to a local Ray; drop it when address is set")
        self.address = address
        self.num_cpus = num_cpus
        self.cpus_per_run = cpus_per_run
        self.command = command
        self.on_event = on_event
        self.sweep_dir = sweep_dir
        self.outcomes: dict[str, TrialOutcome] = {}

    @classmethod
    def for_launch(
        cls, sweep_dir: Path, settings: LaunchSettings, specs: list[RunSpec], hooks: LaunchHooks
    ) -> RayExecutor:
        return cls(
            address=settings.ray_address,
            # `workers` sizes a local Ray; a cluster (a grid's workers, an address) has its own.
            num_cpus=None if settings.ray_address else settings.workers,
            cpus_per_run=cpus_per_run(specs),
            on_event=hooks.on_event,
            sweep_dir=sweep_dir,
        )

    @classmethod
    def for_sweep(cls, sweep_dir: Path) -> RayExecutor:
        return cls(sweep_dir=sweep_dir)

    @classmethod
    def check_specs(cls, source: str, specs: list[RunSpec]) -> None:
        """No more cores than here, one process per run (a trial starts one command)."""
        for spec in specs:
            check_fits_cores(source, [spec])
            if spec.resources.world_size > 1:
                raise GridError(
                    f"{source}: run {spec.run_id} asks for {spec.resources.world_size} "
                    "processes (resources.nodes x tasks_per_node); only the local and slurm "
                    "executors start multi-process runs"
                )

    def submit(self, run_dirs: list[Path], attempts: dict[str, int]) -> list[Submission]:
        """Run every folder as a trial and return once all have ended (job_id = trial id)."""
        if not run_dirs:
            return []
        jobs = {
            run_dir.name: (self.command(run_dir), str(run_dir), attempts.get(run_dir.name, 1))
            for run_dir in run_dirs
        }
        if len(jobs) != len(run_dirs):
            raise ValueError(f"run folder names must be unique, got {[d.name for d in run_dirs]}")
        import ray  # imported here: starting Ray costs seconds, only the ray executor needs it

        temp_dir = tempfile.mkdtemp(prefix="mxscale-ray-", dir="/tmp")
        try:
            if self.address is None:
                ray.init(num_cpus=self.num_cpus, include_dashboard=False, _temp_dir=temp_dir)
            else:
                ray.init(address=self.address)
            trial_ids, errors = _fit(
                jobs, self.cpus_per_run, Path(temp_dir) / "tune", self.on_event
            )
        finally:
            ray.shutdown()
            shutil.rmtree(temp_dir, ignore_errors=True)
        for run_id in jobs:
            error = errors.get(run_id)
            self.outcomes[run_id] = TrialOutcome(
                run_id, trial_ids.get(run_id), "failed" if error else "done", error
            )
        return [
            Submission(run_id, self.name, trial_ids.get(run_id), attempt)
            for run_id, (_, _, attempt) in jobs.items()
        ]

    def query(self, submissions: list[Submission]) -> dict[str, str]:
        """Trials never outlive `submit`: the ones this executor ran are gone; of another
        launch's, the pids in the run folders tell (the trial's process, else its driver)."""
        ours = [sub for sub in submissions if sub.run_id in self.outcomes]
        others = [sub for sub in submissions if sub.run_id not in self.outcomes]
        if self.sweep_dir is None:  # no run folders to look in
            ours, others = submissions, []
        return {
            **{sub.run_id: "gone" for sub in ours},
            **(pid_states(self.sweep_dir, others) if others else {}),
        }

    def cancel(self, submissions: list[Submission], *, kill: bool = False) -> None:
        """Signal the trials' run processes (SIGTERM checkpoints them; ``kill``: SIGKILL);
        a trial whose command ends so is reported failed, its run folder says cancelled."""
        if self.sweep_dir is not None:
            signal_runs(self.sweep_dir, submissions, stop_signal(kill))


def _fit(
    jobs: dict[str, tuple[list[str], str, int]],
    cpus_per_run: float,
    storage: Path,
    on_event: OnEvent | None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Run the Tune grid; return {run_id: trial_id} and {run_id: error} for failed trials."""
    from ray import tune

    class TrialIds(tune.Callback):
        """Records each trial's id and reports each trial's end to ``on_event``."""

        def __init__(self, on_event: OnEvent | None) -> None:
            self.by_run: dict[str, str] = {}
            self.on_event = on_event

        def __getstate__(self) -> dict[str, Any]:
            # Tune pickles its callbacks into the experiment state, to resume it (which sweep
            # never does); the launcher's callback (a live console) cannot be pickled.
            return {"by_run": self.by_run, "on_event": None}

        def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self.by_run[trial.config["run_id"]] = trial.trial_id

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._report("done", trial)

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._report("failed", trial)

        def _report(self, event: str, trial: Any) -> None:
            if self.on_event is not None:
                self.on_event(event, trial.config["run_id"], None)

    recorder = TrialIds(on_event)
    trainable = tune.with_resources(
        tune.with_parameters(_run_trial, jobs=jobs), {"cpu": cpus_per_run}
    )
    tuner = tune.Tuner(
        trainable,
        param_space={"run_id": tune.grid_search(list(jobs))},
        # Every trial has the same resources: reuse its worker instead of starting a new one.
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(
            name="sweep",
            storage_path=str(storage),
            # A failed run is retried by `sweep launch --retry-failed`, not behind its back.
            failure_config=tune.FailureConfig(max_failures=0),
            callbacks=[recorder],
            verbose=0,
        ),
    )
    errors = {
        result.config["run_id"]: str(result.error).strip().splitlines()[-1]
        for result in tuner.fit()
        if result.error is not None
    }
    return recorder.by_run, errors
