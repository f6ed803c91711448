"""Stochastic rounding: unbiased, the right variance, grid points fixed, seeded, saturating."""

import math

import pytest
import torch

import mx
from mx.formats import ELEM_FORMATS
from mx.stochastic import NoiseSource

N = 20000  # draws per value: bounds below are 5 standard errors
# Positions inside a grid interval (as fractions of the step) where RNE is biased by
# up to 0.4 step, far outside 5 standard errors of the SR mean.
FRACS = (0.1, 0.25, 0.4, 0.6, 0.9)


def _step(u: float, fmt: str) -> float:
    """Grid spacing at scaled magnitude ``u`` of an MX element format."""
    info = ELEM_FORMATS[fmt]
    if info.is_int:
        return 2.0**info.quantum_floor
    return 2.0 ** (max(math.floor(math.log2(u)), info.emin) - info.mbits)


def _cases(fmt: str) -> tuple[float, float, list[float], list[float]]:
    """(scale, anchor, scaled test values, their grid steps) for one format.

    The anchor (the block max) pins the block scale to ``scale``; test values sit at FRACS
    of a grid interval in several binades below the top (and in the subnormal range).
    """
    if fmt == "nvfp4":
        # amax = 6 * 448 * 2^-8: tensor scale 2^-8, the max block's E4M3 scale 448.
        scale, anchor = 448 * 2.0**-8, 6.0
        lows, steps = [0.0, 1.0, 2.0, 4.0], [0.5, 0.5, 1.0, 2.0]
    elif fmt == "bf16":
        scale, anchor = 1.0, None
        lows, steps = [1.0, 3.0, 2.0**-130], [2.0**-7, 2.0**-6, 2.0**-133]
    else:
        info = ELEM_FORMATS[fmt]
        scale, anchor = 1.0, 2.0**info.emax
        lows = [2.0**info.emin * 1.5, 1.0, 2.0**info.emax]
        if info.is_int:
            lows = [0.25, 1.0, 1.75]
        steps = [_step(lo, fmt) for lo in lows]
    values, value_steps = [], []
    for lo, step in zip(lows, steps, strict=True):
        for frac in FRACS:
            values.append(lo + frac * step)
            value_steps.append(step)
    return scale, anchor, values, value_steps


def _draws(fmt: str, rounding: str, seed: int = 0):
    scale, anchor, values, steps = _cases(fmt)
    cols = [anchor, *values] if anchor is not None else values
    width = 16 if fmt == "nvfp4" else 32
    chunks = [cols[i : i + width - 1] for i in range(0, len(cols), width - 1)]
    outs = []
    for chunk in chunks:
        row = torch.tensor(([anchor] if anchor is not None and chunk[0] != anchor else []) + chunk)
        x = (row * scale).repeat(N, 1)
        q = mx.quantize(x, fmt, rounding=rounding, generator=torch.Generator().manual_seed(seed))
        q = q.double() / scale
        outs.append(q[:, 1:] if anchor is not None else q)
    return torch.cat(outs, 1), torch.tensor(values, dtype=torch.float64), torch.tensor(steps)


def _moments_ok(q, values, steps):
    """Per value: mean within 5 SE of x, variance within 5 SE of (x - lo)(hi - x)."""
    p = ((values % steps) / steps).double()
    lo = values - p * steps
    var = (values - lo) * (lo + steps - values)
    mean_ok = (q.mean(0) - values).abs() <= 5 * torch.sqrt(var / N) + 1e-12
    # Sample variance of step * Bernoulli(p): sd ≈ step² sqrt((μ4 - σ⁴) / N).
    mu4 = p * (1 - p) * (1 - 3 * p + 3 * p * p) * steps.double() ** 4
    var_ok = (q.var(0) - var).abs() <= 5 * torch.sqrt((mu4 - var * var) / N) + 1e-12
    return mean_ok, var_ok


FORMATS = [*sorted(ELEM_FORMATS), "nvfp4", "bf16"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_unbiased_with_the_bernoulli_variance(fmt):
    q, values, steps = _draws(fmt, "stochastic")
    mean_ok, var_ok = _moments_ok(q, values, steps)
    assert mean_ok.all(), (values[~mean_ok], q.mean(0)[~mean_ok])
    assert var_ok.all(), (values[~var_ok], q.var(0)[~var_ok])
    # Only the two neighbours are ever produced.
    lo = values - values % steps
    assert ((q == lo) | (q == lo + steps)).all()


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp4_e2m1", "int8", "nvfp4"])
def test_the_bounds_reject_a_biased_rounding(fmt):
    # The same statistics on round-to-nearest must fail, or the test above proves nothing.
    q, values, steps = _draws(fmt, "even")
    mean_ok, var_ok = _moments_ok(q, values, steps)
    assert not mean_ok.all() and not var_ok.all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_grid_points_map_to_themselves(fmt):
    if fmt == "nvfp4":
        # Re-deriving NVFP4's two scales from a quantized tensor is not exact, so build
        # grid points whose scales are: E2M1 values x 1.75 with the anchor 6 in each block.
        grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -1, -1.5, -2, -3, -4, -6])
        q = grid[torch.randint(0, len(grid), (64, 64))]
        q[:, ::16] = 6.0
        q = q * 1.75
        assert torch.equal(mx.quantize(q, fmt), q)
    else:
        x = torch.randn(64, 64) * torch.exp(torch.randn(64, 1))
        q = mx.quantize(x, fmt, rounding="even")
    again = mx.quantize(q, fmt, rounding="stochastic", generator=3)
    assert torch.equal(again, q)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp6_e3m2", "nvfp4", "bf16", "fp16"])
def test_same_seed_same_bits_and_the_stream_advances(fmt):
    x = torch.randn(8, 64)
    a = mx.quantize(x, fmt, rounding="stochastic", generator=torch.Generator().manual_seed(7))
    b = mx.quantize(x, fmt, rounding="stochastic", generator=7)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    gen = torch.Generator().manual_seed(7)
    first = mx.quantize(x, fmt, rounding="stochastic", generator=gen)
    second = mx.quantize(x, fmt, rounding="stochastic", generator=gen)
    assert torch.equal(first, a) and not torch.equal(second, first)


def test_saturation_as_with_round_to_nearest():
    # 464 in an E4M3 block with scale 1 lies above max normal 448: always 448, never more.
    x = torch.tensor([[464.0, 447.0, -470.0] + [0.0] * 29]).repeat(1000, 1)
    q = mx.quantize(x, "fp8_e4m3", rounding="stochastic", generator=0)
    assert (q[:, 0] == 448).all() and (q[:, 2] == -448).all()
    assert set(q[:, 1].tolist()) == {416.0, 448.0}


def test_bad_generator_is_a_clear_error():
    with pytest.raises(ValueError, match="generator"):
        mx.quantize(torch.ones(32), "fp8_e4m3", rounding="stochastic", generator="seed")


def test_noise_source_state_resumes_the_stream():
    src = NoiseSource(5)
    gen = src.generator(torch.device("cpu"))
    torch.rand(10, generator=gen)
    state = src.state_dict()
    expected = torch.rand(10, generator=gen)
    restored = NoiseSource(0)
    restored.load_state_dict(state)
    assert torch.equal(torch.rand(10, generator=restored.generator(torch.device("cpu"))), expected)
