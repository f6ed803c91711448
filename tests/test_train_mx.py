"""Training through mx.apply: the quantized run trains, records clip rates, differs from fp32."""

import pyarrow.parquet as pq
import pytest

from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
from models.runner import train_run
from mx.spec import PrecisionSpec

FP8 = PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3", elementwise="bf16", ln="bf16")


def _spec(precision):
    return RunSpec(
        model=LMConfig(d_model=32, head_dim=32, vocab_size=64, seq_len=16),
        data=SyntheticData(order=1, branching=4),
        precision=precision,
        train=TrainConfig(steps=40, batch_size=8, lr=3e-3, log_every=5, stats_every=20),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {
        name: (train_run(_spec(p), d := tmp_path_factory.mktemp(name)), d)
        for name, p in (("fp32", PrecisionSpec()), ("fp8", FP8))
    }


def test_mx_run_trains_close_to_fp32_but_not_identically(runs):
    fp32, fp8 = runs["fp32"][0], runs["fp8"][0]
    assert fp8["state"] == "done" and fp8["config"] == "fp8_e4m3_fp8_e4m3"
    assert fp8["w_fmt"] == "fp8_e4m3" and fp8["n_params"] == fp32["n_params"]
    assert fp8["final_val_loss"] < fp8["initial_loss"] - 0.5
    assert fp8["final_val_loss"] != fp32["final_val_loss"]
    assert fp8["final_val_loss"] == pytest.approx(fp32["final_val_loss"], abs=0.3)


def test_clip_rates_are_logged_per_layer_at_stats_steps(runs):
    df = pq.read_table(runs["fp8"][1] / "metrics").to_pandas()
    df["name"] = df["name"].astype(str)
    clips = df[df.name.str.startswith("mx/clip/")]
    assert {"mx/clip/blocks.0.mlp.fc1/w", "mx/clip/blocks.0.mlp.fc1/a", "mx/clip/head/w"} <= set(
        clips.name
    )
    assert set(clips.step) == {20, 40}
    assert clips.value.between(0.0, 1.0).all()
    fp32 = pq.read_table(runs["fp32"][1] / "metrics").to_pandas()
    assert not fp32.name.astype(str).str.startswith("mx/").any()
