"""A non-finite state is never checkpointed, and a resume never loads one."""

from __future__ import annotations

import math

import pytest
import torch

from models.checkpoint import finite_state, load_latest, save_checkpoint
from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
from models.runner import make_trainer
from runfolder.paths import checkpoint_steps

SPEC = RunSpec(
    model=LMConfig(d_model=32, head_dim=32, vocab_size=64, seq_len=16),
    data=SyntheticData(order=1, branching=4),
    train=TrainConfig(steps=12, batch_size=4, lr=3e-3, log_every=1, checkpoint_every=2),
)


def test_finite_state_looks_into_nested_tensors():
    state = {"model": {"w": torch.ones(3)}, "optimizer": {"state": [{"m": torch.zeros(2)}]}}
    assert finite_state({**state, "rng": torch.zeros(4, dtype=torch.uint8), "step": 3})
    state["optimizer"]["state"][0]["m"][1] = math.inf
    assert not finite_state(state)
    assert not finite_state({"w": torch.tensor([1.0, math.nan], dtype=torch.bfloat16)})


def test_resume_skips_a_poisoned_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 1, {"w": torch.ones(2), "step": 1})
    save_checkpoint(tmp_path, 2, {"w": torch.tensor([1.0, math.nan]), "step": 2})
    with pytest.warns(UserWarning, match="non-finite state"):
        assert load_latest(tmp_path)["step"] == 1


def test_diverged_run_keeps_its_last_finite_checkpoint(tmp_path, capfd):
    run_dir = tmp_path / "run"
    trainer = make_trainer(SPEC, run_dir)
    trainer.run(until=4)
    assert checkpoint_steps(run_dir / "checkpoints") == [2, 4]
    with torch.no_grad():  # what an overflow does to a weight
        next(trainer.model.parameters()).fill_(math.nan)
    summary = trainer.run()
    assert summary["state"] == "diverged" and summary["diverged_step"] == 5
    # The divergence at step 5 wrote no checkpoint: the newest one is still step 4's.
    assert checkpoint_steps(run_dir / "checkpoints") == [2, 4]
    assert "step 5: non-finite state, not checkpointed" in capfd.readouterr().out
    resumed = make_trainer(SPEC, run_dir)
    assert resumed.step == 4
    assert all(bool(torch.isfinite(p).all()) for p in resumed.model.parameters())
