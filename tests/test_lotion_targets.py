"""LOTION for every scaled target format: the stochastic-rounding variance on MX, NVFP4 and
per-channel grids (hand-computed blocks, Monte-Carlo), the penalty it builds and runs."""

import pytest
import torch
from pydantic import ValidationError
from torch import nn

import mx
from models.config import LMConfig, RunSpec, SyntheticData, TrainConfig
from models.lotion import lotion_penalty
from models.runner import train_run
from mx.spec import SCALED_FORMATS
from mx.variance import sr_variance


def _block(values: list[float], size: int = 32) -> torch.Tensor:
    return torch.tensor([values + [0.0] * (size - len(values))])


def test_mxfp4_variance_by_hand():
    # amax 12: E8M0 scale 2^(floor(log2 12) - emax 2) = 2, so scaled values are x / 2.
    x = _block([12.0, 3.5, 0.5, 7.0, 5.0, 2.2, 6.0, 0.75])
    var = sr_variance(x, "fp4_e2m1")[0, :9].tolist()
    expected = [
        0.0,  # 6: the largest grid point
        0.25**2 * 4,  # 1.75: midway in [1.5, 2] (spacing 0.5): (Δ/2)² · scale²
        0.25**2 * 4,  # 0.25: midway in the subnormal step [0, 0.5]
        0.5**2 * 4,  # 3.5: midway in [3, 4] (spacing 1)
        0.5**2 * 4,  # 2.5: midway in [2, 3]
        0.1 * 0.4 * 4,  # 1.1 in [1, 1.5]: (m − lo)(hi − m) · scale²
        0.0,  # 3: a grid point
        0.375 * 0.125 * 4,  # 0.375 in the subnormal step [0, 0.5]
        0.0,  # padding zeros: on the grid
    ]
    assert var == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_mx_saturation_and_int8_grids_by_hand():
    # amax 14: scale 2, 14 / 2 = 7 > 6 saturates (SR always returns 6): variance 0.
    var = sr_variance(_block([14.0, 11.0, -11.0]), "fp4_e2m1")[0, :3].tolist()
    assert var == pytest.approx([0.0, 1.5 * 0.5 * 4, 1.5 * 0.5 * 4])  # 5.5 in [4, 6]
    # MXINT8: amax 1 -> scale 1, uniform spacing 2^-6; 1/128 is midway between 0 and 1/64.
    var8 = sr_variance(_block([1.0, 1 / 128, 0.5 + 1 / 256]), "int8")[0, :3].tolist()
    assert var8 == pytest.approx([0.0, (1 / 128) ** 2, (1 / 256) * (3 / 256)])
    # FP8 E4M3, amax 448 -> scale 1: in [2, 4) the spacing is 2^(1 - 3 mantissa bits) = 1/4,
    # so 3.125 is midway in [3, 3.25]; below 2^-6 the subnormal spacing is 2^-9.
    var_e4m3 = sr_variance(_block([448.0, 3.125, 2**-9 * 1.5]), "fp8_e4m3")[0, :3].tolist()
    assert var_e4m3 == pytest.approx([0.0, 0.125**2, (2**-10) ** 2])


def test_nvfp4_variance_by_hand():
    # Tensor amax 2688 = 448 · 6: tensor scale 1. Block 1: amax 2688 -> block scale 448.
    # Block 2: amax 12 -> block scale 2. Block 3: amax 12.75 -> 2.125 rounds (tie, even) to
    # the E4M3 value 2, so 12.75 / 2 = 6.375 saturates.
    x = torch.zeros(1, 48)
    x[0, :3] = torch.tensor([2688.0, 448 * 1.75, 448 * 4.0])
    x[0, 16:19] = torch.tensor([12.0, 3.5, 0.5])
    x[0, 32:34] = torch.tensor([12.75, 5.0])
    var = sr_variance(x, "nvfp4")[0]
    assert var[:3].tolist() == pytest.approx([0.0, 0.0625 * 448**2, 0.0])
    assert var[16:19].tolist() == pytest.approx([0.0, 0.0625 * 4, 0.0625 * 4])
    assert var[32:34].tolist() == pytest.approx([0.0, 0.25 * 4])  # 2.5 in [2, 3]
    assert torch.count_nonzero(var).item() == 4


def test_variance_gradient_points_to_the_nearer_grid_point():
    x = _block([12.0, 2.2, 3.4]).requires_grad_()
    sr_variance(x, "fp4_e2m1").sum().backward()
    # σ² = (m − lo)(hi − m)·s² with m = x / s: dσ²/dx = (lo + hi − 2m)·s, the scale held.
    assert x.grad[0, :3].tolist() == pytest.approx([0.0, (1 + 1.5 - 2.2) * 2, (1.5 + 2 - 3.4) * 2])


@pytest.mark.parametrize("fmt", SCALED_FORMATS)
def test_monte_carlo_variance_matches(fmt):
    torch.manual_seed(0)
    w = torch.randn(4, 64) * torch.logspace(-3, 0, 4).unsqueeze(1)
    expected = sr_variance(w, fmt)
    draws = torch.stack(
        [mx.quantize(w, fmt, rounding="stochastic", generator=s) for s in range(1500)]
    )
    assert torch.allclose(draws.var(0, unbiased=False).sum(), expected.sum(), rtol=0.03)
    # Where nothing saturates SR is unbiased, so E[(Q − w)²] is the variance itself.
    inside = expected > 0
    mse = (draws - w).pow(2).mean(0)
    assert torch.allclose(mse[inside].sum(), expected[inside].sum(), rtol=0.03)
    assert (expected[~inside] == 0).all() and (draws.var(0)[~inside] == 0).all()


def _adam_after_one_step(seed: int = 0) -> tuple[nn.Linear, torch.optim.AdamW]:
    torch.manual_seed(seed)
    lin = nn.Linear(64, 16, bias=False)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3, betas=(0.9, 0.95))
    lin(torch.randn(8, 64)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    return lin, opt


@pytest.mark.parametrize("fmt", ["fp4_e2m1", "nvfp4", "fp8_e4m3"])
def test_penalty_is_half_the_curvature_weighted_monte_carlo_variance(fmt):
    lin, opt = _adam_after_one_step()
    penalty = lotion_penalty(lin, opt, fmt, strength=3.0).item()
    w = lin.weight.detach()
    v_hat = opt.state[lin.weight]["exp_avg_sq"] / (1 - 0.95)
    draws = torch.stack(
        [mx.quantize(w, fmt, rounding="stochastic", generator=s) for s in range(1500)]
    )
    independent = 3.0 * 0.5 * (v_hat * draws.var(0, unbiased=False)).sum().item()
    assert penalty == pytest.approx(independent, rel=0.03)
    assert penalty > 0


def test_lotion_accepts_scaled_targets_only():
    assert TrainConfig(steps=1, lotion={"fmt": "nvfp4"}).quantized_eval == "nvfp4"
    with pytest.raises(ValidationError, match="unknown LOTION target 'bf16'.*fp4_e2m1"):
        TrainConfig(steps=1, lotion={"fmt": "bf16"})


@pytest.mark.parametrize("fmt", ["fp4_e2m1", "nvfp4"])
def test_lotion_run_on_a_block_format(tmp_path, fmt):
    spec = RunSpec(
        model=LMConfig(d_model=32, head_dim=16, vocab_size=64, seq_len=16),
        data=SyntheticData(order=1, branching=4),
        train=TrainConfig(
            steps=20, batch_size=8, lr=3e-3, log_every=5, eval_every=10, lotion={"fmt": fmt}
        ),
    )
    summary = train_run(spec, tmp_path)
    assert spec.train.quantized_eval == fmt
    quantized, plain = summary["final_val_loss_quantized"], summary["final_val_loss"]
    assert quantized is not None and quantized != plain


def test_quantized_envelope_names_the_method_per_target_format():
    import pandas as pd

    from analysis.quantized import quantized_envelope

    runs = pd.DataFrame(
        {
            "config": ["p", "q", "l", "p4", "l4"],
            "w_fmt": ["fp32", "fp4_e2m1", "fp32", "fp32", "fp32"],
            "quantized_eval": ["fp4_e2m1"] * 3 + ["int4"] * 2,
            "lotion": [None, None, "fp4_e2m1", None, "int4"],
            "flops": [1e9] * 5,
            "final_val_loss": [3.0, 3.1, 3.05, 3.0, 3.02],
            "final_val_loss_quantized": [3.4, 3.1, 3.2, 3.3, 3.1],
        }
    )
    table = quantized_envelope(runs)
    got = {(r.quantized_eval, r.config): r.method for r in table.itertuples()}
    assert got == {
        ("fp4_e2m1", "l"): "LOTION",
        ("fp4_e2m1", "p"): "plain",
        ("fp4_e2m1", "q"): "QAT",
        ("int4", "l4"): "LOTION",
        ("int4", "p4"): "plain",
    }


def _lm_spec(**lotion: object) -> RunSpec:
    return RunSpec(
        model=LMConfig(d_model=32, head_dim=16, vocab_size=64, seq_len=16),
        data=SyntheticData(order=1, branching=4),
        train=TrainConfig(
            steps=20,
            batch_size=8,
            lr=3e-3,
            log_every=1,
            eval_every=10,
            checkpoint_every=5,
            lotion=lotion or None,
        ),
    )


def test_lotion_form_keeps_run_ids_at_its_default():
    # The id of this spec before `form` existed (pinned): the default stays out of the hash.
    spec = RunSpec(
        model=LMConfig(d_model=32, head_dim=16, vocab_size=64, seq_len=16),
        data=SyntheticData(order=1, branching=4),
        train=TrainConfig(
            steps=30,
            batch_size=8,
            lr=3e-3,
            log_every=5,
            eval_every=10,
            lotion={"fmt": "int4", "strength": 10.0},
        ),
    )
    assert spec.run_id == "439094738d14"
    monte_carlo = spec.train.lotion.model_copy(update={"form": "monte_carlo"})
    other = spec.model_copy(update={"train": spec.train.model_copy(update={"lotion": monte_carlo})})
    assert other.run_id != spec.run_id


def test_monte_carlo_form_samples_stochastically_rounded_weights():
    from models.lotion import make_lotion
    from mx.stochastic import NoiseSource

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16), nn.Linear(16, 8))
    original = [m.weight.detach().clone() for m in model]
    lotion = make_lotion(_lm_spec(fmt="fp4_e2m1", form="monte_carlo").train.lotion, seed=3)
    reference = NoiseSource(3 + 0x107).generator(torch.device("cpu"))
    with lotion.sampled_weights(model):
        for m, w in zip(model, original, strict=True):
            expected = mx.quantize(w, "fp4_e2m1", rounding="stochastic", generator=reference)
            assert torch.equal(m.weight, expected)
            assert not torch.equal(expected, mx.quantize(w, "fp4_e2m1"))  # not RNE
    assert all(torch.equal(m.weight, w) for m, w in zip(model, original, strict=True))
    # The next step draws new noise; the stream resumes from its saved state.
    state = lotion.state_dict()
    with lotion.sampled_weights(model):
        second = model[0].weight.detach().clone()
    lotion.load_state_dict(state)
    with lotion.sampled_weights(model):
        assert torch.equal(model[0].weight, second)


def _rows(run_dir):
    import pyarrow.parquet as pq

    table = pq.read_table(run_dir / "metrics").to_pandas()
    table = table[~table["name"].astype(str).str.startswith("perf/")]
    return sorted(zip(table["name"].astype(str), table["step"], table["value"], strict=True))


def test_monte_carlo_run_resumes_on_the_same_random_stream(tmp_path):
    from models.runner import make_trainer

    spec = _lm_spec(fmt="int4", form="monte_carlo")
    whole = train_run(spec, tmp_path / "whole")
    make_trainer(spec, tmp_path / "split").run(until=10)
    resumed = train_run(spec, tmp_path / "split")  # a fresh process would do the same
    assert _rows(tmp_path / "split") == _rows(tmp_path / "whole")
    assert resumed["final_val_loss_quantized"] == whole["final_val_loss_quantized"]
    names = {name for name, _, _ in _rows(tmp_path / "whole")}
    assert "val/loss_quantized" in names and "lotion/penalty" not in names
    plain = train_run(_lm_spec(), tmp_path / "plain")
    assert plain["final_val_loss"] != whole["final_val_loss"]  # the noise changes training


@pytest.mark.parametrize("rule", ["rceil", "ceil", "even"])
def test_variance_follows_the_scale_rule(rule):
    torch.manual_seed(1)
    w = torch.randn(2, 64)
    draws = torch.stack(
        [
            mx.quantize(w, "fp4_e2m1", scale_rule=rule, rounding="stochastic", generator=s)
            for s in range(1000)
        ]
    )
    expected = sr_variance(w, "fp4_e2m1", scale_rule=rule)
    assert torch.allclose(draws.var(0, unbiased=False).sum(), expected.sum(), rtol=0.03)
    with pytest.raises(ValueError, match="scale_rule 'paper_bump'"):
        sr_variance(w, "fp8_e4m3", scale_rule="paper_bump")
