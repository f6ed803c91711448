"""A short training run: learning, metrics table, schedule, divergence."""

import math

import pyarrow.parquet as pq
import pytest

from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
from models.runner import train_run
from models.train import lr_at
from runfolder.metrics import metrics_schema


def _spec(**train):
    defaults = dict(steps=150, batch_size=16, lr=3e-3, log_every=5, stats_every=25)
    return RunSpec(
        model=LMConfig(d_model=64, vocab_size=128, seq_len=32),
        data=SyntheticData(order=1, branching=6),
        train=TrainConfig(**{**defaults, **train}),
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    spec = _spec()
    calls = []

    class Recorder:
        def progress(self, step, total_steps, loss):
            calls.append((step, total_steps, loss))

    return spec, run_dir, train_run(spec, run_dir, Recorder()), calls


def test_loss_falls_well_below_the_unigram_entropy(finished):
    _, _, summary, _ = finished
    assert summary["state"] == "done" and summary["steps_done"] == 150
    gap = summary["unigram_entropy"] - summary["entropy_rate"]
    assert gap > 2.0
    # At least 70% of the way from the unigram entropy down to the true entropy rate.
    assert summary["final_val_loss"] < summary["entropy_rate"] + 0.3 * gap
    assert summary["final_val_loss"] > summary["entropy_rate"] - 0.05
    assert summary["initial_loss"] == pytest.approx(math.log(128), abs=0.1)


def test_summary_counts(finished):
    spec, _, summary, _ = finished
    n = spec.model.param_count()
    assert summary["n_params"] == n
    assert summary["tokens"] == 150 * 16 * 32
    assert summary["flops"] == 6.0 * n * summary["tokens"]
    assert summary["flops_attn"] > summary["flops"]
    assert summary["config"] == "fp32_fp32" and summary["run_id"] == spec.run_id
    assert summary["min_val_loss"] <= summary["final_val_loss"]


def test_metrics_table(finished):
    spec, run_dir, _, calls = finished
    table = pq.read_table(run_dir / "metrics")
    assert table.schema.equals(metrics_schema())
    df = table.to_pandas()
    df["name"] = df["name"].astype(str)
    assert set(df.run_id) == {spec.run_id}
    assert not df.duplicated(["step", "name"]).any()
    loss_steps = df[df.name == "train/loss"].step.tolist()
    assert loss_steps == [1, *range(5, 151, 5)]
    assert [c[0] for c in calls] == loss_steps and calls[-1][1] == 150
    assert df[df.name == "val/loss"].step.tolist() == list(range(15, 151, 15))
    assert df[df.name == "optim/grad_norm"].step.tolist() == [25, 50, 75, 100, 125, 150]
    names = set(df.name)
    for name in (
        "train/lr",
        "perf/step_time",
        "perf/tokens_per_s",
        "grad_norm/embed.weight",
        "param_norm/blocks.0.mlp.fc1.weight",
        "ln/blocks.0.attn.q_norm/weight_std",
        "ln/final_norm/weight_max",
    ):
        assert name in names
    assert (df.tokens == df.step * 16 * 32).all()
    assert (df.flops == 6.0 * spec.model.param_count() * df.tokens).all()


def test_lr_schedule_matches_the_paper():
    cfg = TrainConfig(steps=100, lr=2e-4)
    assert lr_at(0, cfg) == pytest.approx(2e-5)
    assert lr_at(10, cfg) == pytest.approx(2e-5 + 0.5 * 1.8e-4)
    assert lr_at(20, cfg) == pytest.approx(2e-4)
    assert lr_at(99, cfg) == pytest.approx(2e-5)
    assert lr_at(20 + 79 // 2, cfg) < lr_at(21, cfg)


def test_huge_lr_diverges_as_data(tmp_path):
    spec = _spec(steps=200, lr=5.0, log_every=1, divergence_window=5, warmup_frac=0.0)
    summary = train_run(spec, tmp_path)
    assert summary["state"] == "diverged"
    assert summary["diverged_step"] is not None and summary["steps_done"] < 200
    assert summary["steps_done"] == summary["diverged_step"]
    df = pq.read_table(tmp_path / "metrics").to_pandas()
    assert df.step.max() == summary["diverged_step"]
    # A second call on a finished run returns the same result without training again.
    again = train_run(spec, tmp_path)
    assert again["diverged_step"] == summary["diverged_step"]
    assert pq.read_table(tmp_path / "metrics").num_rows == len(df)
