"""Training with the NVFP4 recipe: SR gradients resume on the same random stream."""

import pyarrow.parquet as pq
import torch

from models.checkpoint import load_latest
from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
from models.runner import make_trainer, train_run
from mx.spec import PrecisionSpec
from runfolder.paths import checkpoint_path

RECIPE = PrecisionSpec(
    w_fmt="nvfp4",
    a_fmt="nvfp4",
    rounding="even",
    grad_rounding="stochastic",
    hadamard_wgrad=True,
    keep_bf16=("head",),
    elementwise="bf16",
    ln="bf16",
)
SPEC = RunSpec(
    model=LMConfig(d_model=32, head_dim=16, vocab_size=64, seq_len=16),
    data=SyntheticData(order=1, branching=4),
    precision=RECIPE,
    train=TrainConfig(steps=12, batch_size=8, lr=3e-3, log_every=1, stats_every=6, eval_every=6),
)


def _losses(run_dir):
    df = pq.read_table(run_dir / "metrics").to_pandas()
    df = df[df.name.astype(str) == "train/loss"].sort_values("step")
    return df.value.tolist()


def test_resume_continues_the_same_rounding_stream(tmp_path):
    ref = train_run(SPEC, tmp_path / "ref")
    assert ref["state"] == "done"
    assert ref["config"] == "nvfp4_nvfp4_sr_grad_rht_keep_bf16_1"
    make_trainer(SPEC, tmp_path / "cut", None).resume().run(until=5)
    state = load_latest(tmp_path / "cut" / "checkpoints")
    assert state["step"] == 5 and "mx_rounding" in state
    train_run(SPEC, tmp_path / "cut")
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "ref")
    # Without the saved stream the resumed run draws other roundings: the state matters.
    lost = tmp_path / "lost"
    make_trainer(SPEC, lost, None).resume().run(until=5)
    ckpt = checkpoint_path(lost / "checkpoints", 5)
    broken = torch.load(ckpt, weights_only=False)
    del broken["mx_rounding"]
    torch.save(broken, ckpt)
    train_run(SPEC, lost)
    assert _losses(lost)[:5] == _losses(tmp_path / "ref")[:5]
    assert _losses(lost)[5:] != _losses(tmp_path / "ref")[5:]


def test_a_state_with_a_rounding_stream_loads_into_a_run_without_sr(tmp_path):
    # What a branch does when its arm drops stochastic rounding (e.g. full_precision).
    make_trainer(SPEC, tmp_path / "sr", None).resume().run(until=3)
    state = load_latest(tmp_path / "sr" / "checkpoints")
    for precision in (PrecisionSpec(), PrecisionSpec(w_fmt="nvfp4", a_fmt="nvfp4")):
        other = SPEC.model_copy(update={"precision": precision})
        trainer = make_trainer(other, tmp_path / precision.label, None)
        trainer.load_state(state)
        assert trainer.step == 3
