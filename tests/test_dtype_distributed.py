"""bf16 parameters under bf16 autocast on 2 gloo ranks (DDP and FSDP) follow the single-process
run: ``train.param_dtype`` means the same numerics whatever the strategy or world size."""

from __future__ import annotations

import numpy as np
import pytest
from test_distributed import assert_same_trajectory, make_spec, metrics, write_run

from models.runner import train_run
from sweep.executors.base import run_command
from sweep.executors.local import spawn_ranks


def losses(run_dir) -> np.ndarray:
    values = metrics(run_dir)
    return np.array([v for (name, _), v in sorted(values.items()) if name == "train/loss"])


@pytest.mark.slow
def test_bf16_params_on_ddp_and_fsdp_ranks_follow_one_process(tmp_path):
    # Without clipping, as the fp32 FSDP test: FSDP sums the gradient norm from shards.
    settings = dict(steps=20, autocast="bf16", param_dtype="bf16", grad_clip=0.0)
    train_run(make_spec(**settings), tmp_path / "alone")
    expected = metrics(tmp_path / "alone")
    train_run(make_spec(steps=20, autocast="bf16", grad_clip=0.0), tmp_path / "fp32")
    # bf16 weights change the run, so agreeing below says something.
    changed = np.abs(losses(tmp_path / "fp32") / losses(tmp_path / "alone") - 1).max()
    assert changed > 1e-3
    for strategy in ("ddp", "fsdp"):
        spec = make_spec(tasks=2, strategy=strategy, **settings)
        run_dir = write_run(tmp_path / strategy, spec)
        assert spawn_ranks(run_command(run_dir), 2) == 0
        assert_same_trajectory(run_dir, expected)
