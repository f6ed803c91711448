"""The training loop against oracles that do not come from the loop itself: a resume is
proved to load the checkpoint on disk (an altered checkpoint is continued from), a NaN
injected at a known step ends the run there, and AdamW, clipping and the lr schedule are
checked against hand-written versions of the README's formulas."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from models.checkpoint import load_checkpoint
from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
from models.data import build_data
from models.runner import make_trainer, train_run
from models.transformer import TransformerLM
from mx.spec import PrecisionSpec
from runfolder.paths import checkpoint_path, checkpoint_steps
from sweep.run import execute


def micro_spec(**train: object) -> RunSpec:
    settings = dict(
        steps=30,
        batch_size=8,
        micro_batch_size=4,
        lr=3e-3,
        log_every=1,
        stats_every=5,
        eval_every=10,
        checkpoint_every=10,
    )
    return RunSpec(
        model=LMConfig(d_model=32, n_layers=1, head_dim=16, vocab_size=64, seq_len=16),
        data=SyntheticData(order=1, branching=4),
        train=TrainConfig(**{**settings, **train}),
    )


class Steps:
    """Reporter recording every (step, loss) the loop reports."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float | None]] = []

    def progress(self, step: int, total_steps: int, loss: float | None) -> None:
        self.seen.append((step, loss))


def rows(run_dir: Path):
    table = pq.read_table(run_dir / "metrics").to_pandas()
    table["name"] = table["name"].astype(str)
    return table


def fresh_model(spec: RunSpec, model_state: dict) -> TransformerLM:
    model = TransformerLM(spec.model)
    model.load_state_dict(model_state)
    return model


def alter_checkpoint(run_dir: Path, step: int, change) -> dict:
    """Rewrite the checkpoint of ``step`` with ``change(state)`` applied; return the state."""
    path = checkpoint_path(run_dir / "checkpoints", step)
    state = load_checkpoint(path)
    change(state)
    torch.save(state, path)
    return state


def test_resume_continues_from_the_altered_checkpoint_on_disk(tmp_path):
    spec = micro_spec()
    run_dir = tmp_path / "run"
    make_trainer(spec, run_dir).run(until=20)
    assert checkpoint_steps(run_dir / "checkpoints")[-1] == 20

    def scale_head(state: dict) -> None:
        state["model"]["head.weight"] = state["model"]["head.weight"] * 3.0

    state = alter_checkpoint(run_dir, 20, scale_head)
    # The oracle: the altered weights, loaded by hand, on the batch of 0-based step 20.
    batch = torch.from_numpy(build_data(spec).train_batch(20))
    with torch.no_grad():
        expected = fresh_model(spec, state["model"]).loss(batch).item()
        unaltered = state["model"]["head.weight"] / 3.0
        plain = fresh_model(spec, {**state["model"], "head.weight": unaltered}).loss(batch).item()
    assert abs(expected - plain) > 1e-2, "the alteration must change the next loss"

    reporter = Steps()
    resumed_at = time.time()
    trainer = make_trainer(spec, run_dir, reporter)
    assert trainer.step == 20
    trainer.run()
    first_step, first_loss = reporter.seen[0]
    assert first_step == 21
    assert first_loss == pytest.approx(expected, rel=1e-5)
    assert [s for s, _ in reporter.seen] == list(range(21, 31))
    # Rows: steps 1..20 from the first attempt once each, the resumed attempt from 21 on.
    table = rows(run_dir)
    loss = table[table["name"] == "train/loss"]
    assert sorted(loss["step"]) == list(range(1, 31))
    assert loss[loss["wall_time"] >= resumed_at]["step"].min() == 21


def test_resumed_attempt_is_shorter_than_a_rerun(tmp_path):
    spec = micro_spec(steps=40, checkpoint_every=32, eval_every=40)
    run_dir = tmp_path / "run"
    make_trainer(spec, run_dir).run(until=32)

    started = time.perf_counter()
    resumed = Steps()
    make_trainer(spec, run_dir, resumed).run()
    resumed_s = time.perf_counter() - started

    started = time.perf_counter()
    rerun = Steps()
    make_trainer(spec, tmp_path / "rerun", rerun).run()
    rerun_s = time.perf_counter() - started

    assert len(resumed.seen) == 8 and len(rerun.seen) == 40
    # 8 steps against 40: a resume that retrained from step 0 would take as long.
    assert resumed_s < 0.7 * rerun_s, (resumed_s, rerun_s)


def test_nan_injected_at_a_known_step_ends_the_run_diverged_there(tmp_path, monkeypatch):
    # A window longer than the run: only the NaN/Inf rule can end it.
    spec = micro_spec(divergence_window=1000)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(spec.model_dump_json())
    make_trainer(spec, run_dir).run(until=10)
    # The resumed attempt's training forwards give NaN logits, so step 11 is the first
    # non-finite loss. (A NaN written into the checkpoint would not do: resume skips a
    # poisoned checkpoint, tested in test_checkpoint_finite.py.)
    plain_forward = TransformerLM.forward

    def poisoned_forward(self, tokens):
        logits = plain_forward(self, tokens)
        return logits * math.nan if self.training else logits

    monkeypatch.setattr(TransformerLM, "forward", poisoned_forward)
    assert execute(run_dir) == 0
    marker = json.loads((run_dir / "state.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert marker["state"] == "diverged" and marker["step"] == 11
    assert summary["state"] == "diverged"
    assert summary["diverged_step"] == 11 and summary["steps_done"] == 11
    loss = rows(run_dir).query("name == 'train/loss'").set_index("step")["value"]
    assert np.isfinite(loss[10]) and np.isnan(loss[11]) and loss.index.max() == 11


def expected_lr(step: int, cfg: TrainConfig) -> float:
    """The README's schedule written out: linear warmup over steps/5 from 0.1·lr, then a
    cosine to 0.1·lr at the last step."""
    warmup = round(cfg.steps / 5)
    if step < warmup:
        return cfg.lr * (0.1 + 0.9 * step / warmup)
    t = (step - warmup) / (cfg.steps - 1 - warmup)
    return cfg.lr * (0.1 + 0.9 * (1 + math.cos(math.pi * t)) / 2)


def test_logged_lr_follows_the_documented_schedule(tmp_path):
    spec = micro_spec(steps=11, lr=1e-2, eval_every=11, checkpoint_every=11)
    train_run(spec, tmp_path)
    lr = rows(tmp_path).query("name == 'train/lr'").set_index("step")["value"]
    # Update u is taken with the lr of 0-based step u - 1.
    got = [lr[u] for u in range(1, 12)]
    want = [expected_lr(u - 1, spec.train) for u in range(1, 12)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # The shape's landmarks, by hand: 0.1·lr, halfway up, lr, the cosine's midpoint, 0.1·lr.
    np.testing.assert_allclose(
        [got[0], got[1], got[2], got[6], got[10]], [1e-3, 5.5e-3, 1e-2, 5.5e-3, 1e-3], rtol=1e-12
    )


def test_paper_defaults_are_the_documented_ones():
    cfg = TrainConfig(steps=100)
    assert (cfg.lr, cfg.beta1, cfg.beta2, cfg.eps) == (2e-4, 0.9, 0.95, 1e-15)
    assert (cfg.grad_clip, cfg.weight_decay, cfg.schedule) == (1.0, 0.0, "cosine")
    assert (cfg.warmup_frac, cfg.warmup_init_frac, cfg.final_lr_frac) == (0.2, 0.1, 0.1)


def reference_adamw(spec: RunSpec, updates: int) -> dict[str, torch.Tensor]:
    """The run's first ``updates`` optimizer steps by hand: micro-batch mean gradients,
    global-norm clipping, decoupled weight decay, bias-corrected Adam, in float64."""
    cfg = spec.train
    torch.manual_seed(spec.seed)
    model = TransformerLM(spec.model)
    data = build_data(spec)
    params = dict(model.named_parameters())
    m = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    v = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params.items()}
    for step in range(updates):
        model.zero_grad()
        chunks = torch.from_numpy(data.train_batch(step)).split(cfg.micro_batch_size)
        for chunk in chunks:
            (model.loss(chunk) / len(chunks)).backward()
        grads = {n: p.grad.double() for n, p in params.items()}
        norm = math.sqrt(sum(float((g**2).sum()) for g in grads.values()))
        assert norm > cfg.grad_clip, "the test needs clipping to be active"
        grads = {n: g * (cfg.grad_clip / (norm + 1e-6)) for n, g in grads.items()}
        lr, t = expected_lr(step, cfg), step + 1
        with torch.no_grad():
            for name, p in params.items():
                g = grads[name]
                m[name] = cfg.beta1 * m[name] + (1 - cfg.beta1) * g
                v[name] = cfg.beta2 * v[name] + (1 - cfg.beta2) * g**2
                m_hat = m[name] / (1 - cfg.beta1**t)
                v_hat = v[name] / (1 - cfg.beta2**t)
                new = p.double() * (1 - lr * cfg.weight_decay)
                new -= lr * m_hat / (v_hat.sqrt() + cfg.eps)
                p.copy_(new.float())
    return {n: p.detach().clone() for n, p in params.items()}


def test_updates_match_a_hand_written_adamw_with_clipping(tmp_path):
    # Every hyper-parameter distinct from its default and from each other, so a swapped or
    # ignored one shows; the clip is far below the gradient norm.
    spec = micro_spec(
        steps=10,
        lr=1e-2,
        beta1=0.8,
        beta2=0.9,
        eps=1e-4,
        weight_decay=0.3,
        grad_clip=0.05,
        checkpoint_every=10,
    )
    trainer = make_trainer(spec, tmp_path)
    trainer.run(until=4)
    expected = reference_adamw(spec, 4)
    got = dict(trainer.model.named_parameters())
    for name, value in expected.items():
        torch.testing.assert_close(got[name].detach(), value, rtol=2e-5, atol=2e-6, msg=name)


def test_documented_metric_names_are_logged(tmp_path):
    spec = micro_spec(steps=10, eval_every=5, checkpoint_every=10)
    spec = spec.model_copy(update={"precision": PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3")})
    train_run(spec, tmp_path)
    table = rows(tmp_path)
    names = set(table["name"])
    assert {"train/loss", "train/lr", "val/loss", "optim/grad_norm", "perf/tokens_per_s"} <= names
    linears = [
        n for n, m in TransformerLM(spec.model).named_modules() if isinstance(m, torch.nn.Linear)
    ]
    for layer in linears:
        assert {f"mx/clip/{layer}/w", f"mx/clip/{layer}/a"} <= names, layer
    assert set(table["run_id"]) == {spec.run_id}
    # Each logged row carries its step's token and FLOP counts (C = 6·N·D).
    loss = table[table["name"] == "train/loss"].sort_values("step")
    assert list(loss["tokens"]) == [s * 8 * 16 for s in loss["step"]]
    n_params = sum(p.numel() for p in TransformerLM(spec.model).parameters())
    np.testing.assert_allclose(loss["flops"], 6.0 * n_params * loss["tokens"], rtol=1e-12)
