"""Per-channel int formats, LOTION's smoothing term and quantized evaluation."""

import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import mx
from analysis.load import load_sweep_runs
from analysis.quantized import quantized_envelope
from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
from models.lotion import lotion_penalty, quantized_weights
from models.runner import train_run
from mx.channel import sr_variance


def test_per_channel_int_formats():
    w = torch.tensor([[7.0, 3.4, -1.5, 0.2], [0.14, -0.05, 0.0, 0.1], [0.0, 0.0, 0.0, 0.0]])
    q = mx.quantize(w, "int4")
    # Row scales 7/7, 0.14/7, (zero row); RNE on 3.4 -> 3, -1.5 -> -2 (tie to even).
    assert q[0].tolist() == [7.0, 3.0, -2.0, 0.0]
    assert torch.allclose(q[1], torch.tensor([7.0, -2.0, 0.0, 5.0]) * 0.02)
    assert q[2].tolist() == [0.0] * 4
    q8 = mx.quantize(w, "int8_pc")
    assert q8[0, 1].item() == pytest.approx(round(3.4 * 127 / 7) * 7 / 127)
    # Per channel is not MXINT8 (block 32, E8M0 scale): both exist.
    assert not torch.equal(q8, mx.quantize(w, "int8"))
    draws = torch.stack(
        [mx.quantize(w, "int4", rounding="stochastic", generator=s) for s in range(4000)]
    )
    assert draws.mean(0)[0, 1].item() == pytest.approx(3.4, abs=0.05)  # unbiased, RNE gives 3


def test_sr_variance_and_its_gradient():
    w = torch.tensor([[7.0, 3.4, -1.5, 2.0]], requires_grad=True)
    var = sr_variance(w, "int4")
    assert var.detach().tolist()[0] == pytest.approx([0.0, 0.4 * 0.6, 0.25, 0.0])
    var.sum().backward()
    # d/dw (w - lo)(hi - w) = lo + hi - 2w: toward the nearer grid point (scale 1 here).
    assert w.grad[0, 1].item() == pytest.approx(3 + 4 - 2 * 3.4)


def test_penalty_is_zero_before_the_first_update_then_pulls_to_the_grid():
    torch.manual_seed(0)
    lin = nn.Linear(16, 8, bias=False)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3)
    assert lotion_penalty(lin, opt, "int4", 1.0).item() == 0.0
    lin(torch.randn(4, 16)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    before = sr_variance(lin.weight.detach(), "int4").sum()
    penalty = lotion_penalty(lin, opt, "int4", 1.0)
    assert penalty.item() > 0
    penalty.backward()
    with torch.no_grad():
        lin.weight -= 1e-2 * lin.weight.grad / lin.weight.grad.abs().max()
    assert sr_variance(lin.weight.detach(), "int4").sum() < before


def test_quantized_weights_restores_exactly():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    original = [p.detach().clone() for p in model.parameters()]
    with quantized_weights(model, "int4"):
        assert torch.equal(model[0].weight, mx.quantize(original[0], "int4"))
        assert torch.equal(model[0].bias, original[1])  # biases stay
    assert all(torch.equal(p, o) for p, o in zip(model.parameters(), original, strict=True))


def _spec(**train):
    return RunSpec(
        model=LMConfig(d_model=32, head_dim=16, vocab_size=64, seq_len=16),
        data=SyntheticData(order=1, branching=4),
        train=TrainConfig(steps=30, batch_size=8, lr=3e-3, log_every=5, eval_every=10, **train),
    )


def test_lotion_run_records_the_quantized_loss(tmp_path):
    spec = _spec(lotion={"fmt": "int4", "strength": 10.0})
    assert spec.train.quantized_eval == "int4"  # set by lotion
    summary = train_run(spec, tmp_path / "lotion")
    df = pq.read_table(tmp_path / "lotion" / "metrics").to_pandas()
    df["name"] = df["name"].astype(str)
    quantized = df[df.name == "val/loss_quantized"].sort_values("step")
    assert quantized.step.tolist() == [10, 20, 30]
    assert (df[df.name == "lotion/penalty"].value > 0).any()
    assert summary["final_val_loss_quantized"] == quantized.value.iloc[-1]
    plain = train_run(_spec(quantized_eval="int4"), tmp_path / "plain")
    # Same data and init: the term changes the trajectory; the int4 cast changes the loss.
    assert summary["final_val_loss"] != plain["final_val_loss"]
    assert plain["final_val_loss_quantized"] != plain["final_val_loss"]
    assert _spec().run_id != _spec(quantized_eval="int4").run_id


FORMATS = ("fp4_e2m1", "int4", "int8_pc")


@pytest.mark.slow
def test_micro_grid_plain_qat_lotion_through_sweep(tmp_path, repo_root):
    import json

    from tests.test_e2e_cli import sweep

    grid = repo_root / "tests" / "grids" / "lotion_micro.yaml"
    sweep_dir = tmp_path / "sweep"
    launched = sweep(
        "launch", str(grid), "--sweep-dir", str(sweep_dir), "--executor", "local", cwd=repo_root
    )
    assert launched.returncode == 0, launched.stdout + launched.stderr
    summaries = {
        s["config"]: s
        for s in (
            json.loads((d / "summary.json").read_text()) for d in (sweep_dir / "runs").iterdir()
        )
    }
    assert len(summaries) == 9 and all(s["state"] == "done" for s in summaries.values())
    assert all(s["final_val_loss_quantized"] is not None for s in summaries.values())
    # QAT trains on the weights it is evaluated with: both losses are the same model's.
    for qat in ("int4_fp32_qat", "fp4_e2m1_fp32_qat"):
        got = summaries[qat]
        assert got["final_val_loss_quantized"] == pytest.approx(got["final_val_loss"], abs=1e-6)
    plain = summaries["fp32_fp32_plain_fp4_e2m1"]
    assert plain["final_val_loss_quantized"] > plain["final_val_loss"]  # FP4 costs the plain model
    envelope = quantized_envelope(load_sweep_runs(sweep_dir))
    methods = envelope.groupby("quantized_eval")["method"].apply(lambda m: sorted(set(m)))
    assert methods.to_dict() == {f: ["LOTION", "QAT", "plain"] for f in FORMATS}
    out = tmp_path / "figs"
    analyzed = sweep(
        "analyze", str(sweep_dir), "--plot", "quantized", "--out", str(out), cwd=repo_root
    )
    assert analyzed.returncode == 0, analyzed.stdout + analyzed.stderr
    assert (out / "quantized.png").stat().st_size > 10_000
