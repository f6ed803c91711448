"""Runs of several processes on CPU (gloo): DDP and FSDP follow the single-process loss
trajectory of the same global batch, under a local launch, torchrun and a real SLURM, and
a preempted 2-process run resumes on it, also at another world size."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from executor_fixtures import wait_until
from pydantic import ValidationError

from models.config import (
    Branch,
    LMConfig,
    ProxyConfig,
    Resources,
    RunSpec,
    SyntheticData,
    TrainConfig,
)
from models.distributed import World, rendezvous_from_env, slurm_port
from models.runner import make_trainer, train_run
from mx.spec import PrecisionSpec
from runfolder.codes import EXIT_PREEMPTED
from runfolder.paths import checkpoint_steps
from sweep.executors.base import run_command
from sweep.executors.local import LocalExecutor, spawn_ranks
from sweep.executors.slurm import SlurmExecutor, TaskLayout, slurm_available
from sweep.journal import Journal
from sweep.plan import plan_rows
from sweep.run import execute
from sweep.store import SweepStore

ROOT = Path(__file__).resolve().parents[1]
MXFP8 = PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3")
# A launcher process the test can signal, as SLURM or the local executor would.
LAUNCHER = (
    "import sys; from pathlib import Path; from sweep.executors.base import run_command; "
    "from sweep.executors.local import spawn_ranks; "
    "sys.exit(spawn_ranks(run_command(Path(sys.argv[1])), int(sys.argv[2])))"
)


def make_spec(
    tasks: int = 1, strategy: str = "auto", precision: PrecisionSpec = MXFP8, **train: object
) -> RunSpec:
    """A micro LM; each of 2 ranks gets one 4-row micro-batch of the 8-row global batch."""
    settings = dict(
        steps=40,
        batch_size=8,
        micro_batch_size=4,
        lr=3e-3,
        log_every=1,
        stats_every=10,
        eval_every=10,
        checkpoint_every=5,
    )
    return RunSpec(
        model=LMConfig(d_model=32, n_layers=2, head_dim=16, vocab_size=64, seq_len=32),
        data=SyntheticData(order=1, branching=4),
        train=TrainConfig(**{**settings, **train}),
        precision=precision,
        resources=Resources(tasks_per_node=tasks, strategy=strategy),
    )


def write_run(root: Path, spec: RunSpec) -> Path:
    run_dir = root / "runs" / spec.run_id
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(spec.model_dump_json())
    return run_dir


def metrics(run_dir: Path) -> dict[tuple[str, int], float]:
    """Every logged value by (name, step), minus timings and activation clip rates (those
    come from each rank's own rows, so they differ from one process's by design)."""
    table = pq.read_table(run_dir / "metrics").to_pandas()
    table["name"] = table["name"].astype(str)
    keep = ~table.name.str.startswith("perf/") & ~table.name.str.endswith("/a")
    rows = table[keep]
    assert not rows.duplicated(["name", "step"]).any(), "a step was recorded twice"
    return {(n, int(s)): float(v) for n, s, v in zip(rows.name, rows.step, rows.value, strict=True)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Metrics of the single-process run of a spec (cached by run id: resources excluded)."""
    cache: dict[str, dict[tuple[str, int], float]] = {}

    def get(spec: RunSpec) -> dict[tuple[str, int], float]:
        if spec.run_id not in cache:
            alone = spec.model_copy(update={"resources": Resources()})
            run_dir = tmp_path_factory.mktemp("reference")
            train_run(alone, run_dir)
            cache[spec.run_id] = metrics(run_dir)
        return cache[spec.run_id]

    return get


def assert_same_trajectory(
    run_dir: Path, expected: dict[tuple[str, int], float], processes: int = 2, rtol: float = 1e-5
) -> None:
    got = metrics(run_dir)
    assert got.keys() == expected.keys()
    losses = sorted((s, v) for (n, s), v in expected.items() if n == "train/loss")
    assert len(losses) == max(s for s, _ in losses) and losses[-1][1] < losses[0][1] - 0.5
    assert {n for n, _ in expected} >= {"val/loss", "optim/grad_norm", "grad_norm/embed.weight"}
    keys = sorted(expected)
    np.testing.assert_allclose([got[k] for k in keys], [expected[k] for k in keys], rtol=rtol)
    state = json.loads((run_dir / "state.json").read_text())
    assert state["state"] == "done" and state["step"] == state["total_steps"]
    assert state["processes"] == processes
    assert json.loads((run_dir / "summary.json").read_text())["steps_done"] == state["step"]


# --- run specs and the environment --------------------------------------------------------


def test_new_resource_keys_keep_run_ids_and_default_to_one_rank_per_gpu():
    spec = make_spec()
    assert spec.resources.world_size == 1
    assert make_spec(tasks=2, strategy="fsdp").run_id == spec.run_id
    assert Resources(gpus=4, nodes=4).world_size == 16
    with pytest.raises(ValidationError, match="gpus=4 per node needs tasks_per_node=4"):
        Resources(gpus=4, tasks_per_node=2)


@pytest.mark.parametrize(
    ("tasks", "train", "message"),
    [
        (3, {}, "batch_size=8 must split evenly across the run's 3 processes"),
        (2, {"batch_size": 12}, "micro_batch_size=4 must divide the per-process batch 6"),
    ],
)
def test_batches_that_do_not_split_across_ranks_are_refused(tasks, train, message):
    with pytest.raises(ValidationError, match=message):
        make_spec(tasks=tasks, **train)


def test_one_process_runs_refuse_several():
    two = {"tasks_per_node": 2}
    paired = {"model": ProxyConfig(width=32, depth=1, paired=True).model_dump()}
    with pytest.raises(ValidationError, match="paired proxy run trains in one process"):
        RunSpec.model_validate({**paired, "train": {"steps": 5}, "resources": two})
    with pytest.raises(ValidationError, match="branched run trains in one process"):
        RunSpec.model_validate(
            {
                **make_spec().model_dump(),
                "branch": Branch(parent="abc", step=3, arm="bf16").model_dump(),
                "resources": two,
            }
        )


def test_rendezvous_from_torchrun_variables():
    env = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "n1"}
    found = rendezvous_from_env(1, {**env, "MASTER_PORT": "1234"})
    assert (found.world, found.address, found.port) == (World(1, 4, 1), "n1", 1234)
    assert rendezvous_from_env(4, {**env, "WORLD_SIZE": "1", "RANK": "0"}) is None


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="needs scontrol (SLURM client)")
def test_rendezvous_from_an_srun_step():
    step = {
        "SLURM_PROCID": "3",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_JOB_ID": "123456",
    }
    found = rendezvous_from_env(4, step)
    assert (found.world, found.address, found.port) == (World(3, 4, 1), "localhost", 13456)
    # A one-process run inside someone else's step (Ray on SLURM) trains alone, and so does
    # anything in a batch script (no step variables).
    assert rendezvous_from_env(1, step) is None
    batch = {k: v for k, v in step.items() if k != "SLURM_STEP_NUM_TASKS"}
    assert rendezvous_from_env(4, {**batch, "SLURM_NTASKS": "4"}) is None


def test_slurm_ports_differ_between_jobs_and_avoid_ephemeral_ports():
    ports = {slurm_port(str(job)) for job in range(1_000, 21_000)}
    assert len(ports) == 20_000 and min(ports) >= 10_000 and max(ports) < 32_768


def test_each_rank_takes_a_contiguous_slice_of_the_global_batch():
    batch = np.arange(16).reshape(8, 2)
    parts = [World(rank, 4).shard((batch, batch * 10)) for rank in range(4)]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), batch)
    np.testing.assert_array_equal(parts[2][1], batch[4:6] * 10)


def test_plan_counts_gpus_over_nodes():
    spec = make_spec(steps=100).model_copy(update={"resources": Resources(gpus=4, nodes=4)})
    (row,) = plan_rows([spec], gpu_tflops=100.0)
    assert (row["processes"], row["gpus"], row["gpus_per_node"]) == (16, 16, 4)
    assert row["gpu_hours"] == pytest.approx(row["C"] / 1e14 / 3600)
    assert row["wall_hours"] == pytest.approx(row["gpu_hours"] / 16)
    assert plan_rows([make_spec()])[0]["gpu_hours"] is None


# --- training on several processes ----------------------------------------------------------


@pytest.mark.slow
def test_ddp_run_from_the_local_executor_follows_the_single_process_run(tmp_path, reference):
    spec = make_spec(tasks=2, strategy="ddp", steps=20)
    run_dir = write_run(tmp_path, spec)
    events = []
    executor = LocalExecutor(workers=1, on_event=lambda *event: events.append(event[:2]))
    executor.submit([run_dir], {spec.run_id: 1})
    assert events == [("done", spec.run_id)]
    # Bit for bit, as the README says: one micro-batch per rank, the same sums in the same
    # order (validation losses are gathered and averaged in the single-process order).
    assert_same_trajectory(run_dir, reference(spec), rtol=0)


@pytest.mark.slow
def run_torchrun(run_dir: Path, processes: int = 2) -> None:
    """`sweep run` of ``run_dir`` under torchrun on this host; fails the test on an error."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    result = subprocess.run(
        [*torchrun, "--nproc-per-node", str(processes), "-m", "sweep.run", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_fsdp_run_under_torchrun_follows_the_single_process_run(tmp_path, reference):
    # FSDP sums the gradient norm from shards, so with clipping its last bit can differ and
    # MX rounding can grow that over many steps: compared without clipping (bit for bit
    # here); the preemption tests below compare FSDP with clipping in fp32.
    spec = make_spec(tasks=2, strategy="fsdp", grad_clip=0.0)
    run_dir = write_run(tmp_path, spec)
    run_torchrun(run_dir)
    assert_same_trajectory(run_dir, reference(spec))


@pytest.mark.slow
@pytest.mark.parametrize("resume_ranks", [2, 1])
def test_preempted_fsdp_run_resumes_on_the_same_trajectory(tmp_path, reference, resume_ranks):
    spec = make_spec(tasks=2, strategy="fsdp", precision=PrecisionSpec(), steps=60)
    run_dir = write_run(tmp_path, spec)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(run_dir), "2"], cwd=ROOT)
    wait_until(
        lambda: any(s >= 10 for s in checkpoint_steps(run_dir / "checkpoints")),
        180,
        "a checkpoint at step 10",
    )
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=120) == EXIT_PREEMPTED
    stopped = json.loads((run_dir / "state.json").read_text())
    assert stopped["state"] == "preempted" and 10 <= stopped["step"] < spec.train.steps
    assert stopped["processes"] == 2
    assert stopped["step"] == max(checkpoint_steps(run_dir / "checkpoints"))

    if resume_ranks == 2:
        assert spawn_ranks(run_command(run_dir), 2) == 0
    else:
        assert execute(run_dir) == 0
    assert_same_trajectory(run_dir, reference(spec), processes=resume_ranks)


@pytest.mark.slow
def test_single_process_checkpoint_resumes_on_two_fsdp_ranks(tmp_path, reference):
    spec = make_spec(tasks=2, strategy="fsdp", precision=PrecisionSpec(), steps=60)
    run_dir = write_run(tmp_path, spec)
    make_trainer(spec, run_dir).run(until=20)
    assert max(checkpoint_steps(run_dir / "checkpoints")) == 20
    assert spawn_ranks(run_command(run_dir), 2) == 0
    assert_same_trajectory(run_dir, reference(spec))


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.skipif(
    not slurm_available() and os.environ.get("CI") != "true",
    reason="no running SLURM: start one with `slurm/local-cluster.sh up`",
)
def test_two_task_slurm_run_survives_preemption_on_the_same_trajectory(tmp_path, reference):
    spec = make_spec(tasks=2, strategy="ddp", steps=60)
    run_dir = write_run(tmp_path, spec)
    executor = SlurmExecutor(
        tmp_path, time_min=10, layouts={spec.run_id: TaskLayout(tasks_per_node=2)}
    )
    # As the launcher does: the write-ahead journal records the submission the job checks.
    (sub,) = executor.submit([run_dir], {spec.run_id: 1}, journal=Journal(SweepStore(tmp_path)))
    try:
        wait_until(
            lambda: any(s >= 10 for s in checkpoint_steps(run_dir / "checkpoints")),
            300,
            "a checkpoint at step 10 (is the node busy?)",
        )
        # What SLURM does before a time limit: every task of the step gets SIGUSR2.
        subprocess.run(["scancel", "--signal=USR2", sub.job_id], check=True)
        wait_until(
            lambda: json.loads((run_dir / "state.json").read_text())["state"] == "done",
            300,
            "the requeued run to finish",
        )
    finally:
        subprocess.run(["scancel", sub.job_id], check=False)
    logs = run_dir / "logs"
    assert "resuming from step" in (logs / "attempt-1.out").read_text()
    # Rank 1 trains silently: the markers and the attempt lines are rank 0's.
    assert "attempt" not in (logs / "attempt-1.rank1.out").read_text()
    assert_same_trajectory(run_dir, reference(spec))
