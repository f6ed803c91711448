"""The trainer's parts as contracts: every logged metric is declared by a probe (or is one of
the loop's own three), probes only observe, the workload comes from the registry by
``model.kind``, and the paired twin is a component the runner gives."""

from __future__ import annotations

import fnmatch

import pyarrow.parquet as pq
import pytest
import torch

from models import workloads
from models.config import LMConfig, LotionConfig, ProxyConfig, RunSpec, SyntheticData, TrainConfig
from models.probes import Probes
from models.runner import make_trainer
from models.train import Trainer
from mx.spec import PrecisionSpec
from runfolder.metrics import TRAIN_LOSS, TRAIN_LR, VAL_LOSS

LOOP_NAMES = (TRAIN_LOSS, TRAIN_LR, VAL_LOSS)
MX = PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3")
TRAIN = dict(steps=6, batch_size=8, micro_batch_size=4, lr=3e-3, log_every=2, stats_every=3)


def lm_spec(**train: object) -> RunSpec:
    return RunSpec(
        model=LMConfig(d_model=32, n_layers=1, head_dim=16, vocab_size=64, seq_len=16),
        data=SyntheticData(order=1, branching=4),
        train=TrainConfig(**{**TRAIN, **train}),
        precision=MX,
    )


def proxy_spec(paired: bool) -> RunSpec:
    return RunSpec(
        model=ProxyConfig(width=16, depth=2, paired=paired),
        train=TrainConfig(**TRAIN),
        precision=MX,
    )


def logged_names(run_dir) -> set[str]:
    return {str(n) for n in pq.read_table(run_dir / "metrics").column("name").to_pylist()}


@pytest.mark.parametrize(
    "spec",
    [lm_spec(lotion=LotionConfig(fmt="int4")), proxy_spec(paired=True)],
    ids=["lm_lotion_mx", "proxy_paired_mx"],
)
def test_every_logged_metric_is_declared_by_a_probe_or_the_loop(tmp_path, spec):
    trainer = make_trainer(spec, tmp_path)
    trainer.run()
    declared = (*LOOP_NAMES, *trainer.probes.names)
    names = logged_names(tmp_path)
    undeclared = [n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in declared)]
    assert not undeclared
    # Each probe logs something on this run (no probe is declared but dead).
    for probe in trainer.probes.probes:
        assert any(fnmatch.fnmatchcase(n, p) for n in names for p in probe.names), probe


def test_probes_only_observe_training(tmp_path):
    spec = proxy_spec(paired=True)
    probed = make_trainer(spec, tmp_path / "probed")
    bare = make_trainer(spec, tmp_path / "bare")
    bare.probes = Probes([])
    for _ in range(spec.train.steps):
        loss_a, values_a = probed.train_step(stats=True, log=True)
        loss_b, values_b = bare.train_step(stats=True, log=True)
        probed.step += 1
        bare.step += 1
        assert loss_a.item() == loss_b.item()
        assert values_a and not values_b
    for (name, a), b in zip(probed.model.named_parameters(), bare.model.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_the_twin_is_given_not_implied(tmp_path):
    spec = proxy_spec(paired=True)
    plain = Trainer(spec, tmp_path / "plain", None)
    paired = make_trainer(spec, tmp_path / "paired")
    assert plain.twin is None and paired.twin is not None
    # The twin starts from the run's initial weights (copied before mx.apply).
    for a, b in zip(plain.model.parameters(), paired.twin.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not any(n.startswith("paired/") for n in plain.train_step(True, True)[1])
    values = paired.train_step(True, True)[1]
    assert values["paired/grad_cos"] < 1.0 and "paired/fp32_loss" in values


def test_the_workload_comes_from_the_registry_by_kind(tmp_path, monkeypatch):
    real = workloads.workload_for("proxy")
    built: list[str] = []

    class Counting:
        def build(self, spec, device):
            built.append(spec.model.kind)
            return real.build(spec, device)

        def extra_flops(self, spec, tokens):
            return 123.0

    monkeypatch.setitem(workloads._WORKLOADS, "proxy", Counting())
    trainer = Trainer(proxy_spec(paired=False), tmp_path, None)
    assert built == ["proxy"]
    summary = trainer.summary()
    assert summary["flops_attn"] == summary["flops"] + 123.0


def test_an_unknown_kind_names_the_missing_module():
    with pytest.raises(ValueError, match=r"models/workloads/nope\.py"):
        workloads.workload_for("nope")
