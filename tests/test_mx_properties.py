"""Hypothesis properties of mx.quantize listed in mx-formats.md."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import mx
from mx.formats import ELEM_FORMATS

FORMATS = sorted(ELEM_FORMATS)
finite = st.floats(-1e4, 1e4, width=32).filter(lambda v: v == 0 or abs(v) > 1e-6)
blocks_2 = arrays(np.float32, (2, 32), elements=finite)
common = settings(max_examples=60, deadline=None)


@common
@given(
    blocks_2,
    st.sampled_from(FORMATS),
    st.sampled_from(["floor", "rceil"]),
    st.sampled_from(["even", "half_away"]),
)
def test_idempotent_and_odd(x, fmt, rule, rounding):
    t = torch.from_numpy(x)
    once = mx.quantize(t, fmt, scale_rule=rule, rounding=rounding)
    assert torch.equal(mx.quantize(once, fmt, scale_rule=rule, rounding=rounding), once)
    assert torch.equal(mx.quantize(-t, fmt, scale_rule=rule, rounding=rounding), -once)


@common
@given(blocks_2, st.sampled_from(FORMATS), st.integers(-40, 40))
def test_power_of_two_equivariance(x, fmt, k):
    t = torch.from_numpy(x)
    scaled = mx.quantize(t * 2.0**k, fmt)
    assert torch.equal(scaled, mx.quantize(t, fmt) * 2.0**k)


@common
@given(blocks_2, arrays(np.float32, 32, elements=finite), st.sampled_from(FORMATS))
def test_blocks_are_independent(x, other, fmt):
    t = torch.from_numpy(x)
    changed = t.clone()
    changed[1] = torch.from_numpy(other)
    assert torch.equal(mx.quantize(changed, fmt)[0], mx.quantize(t, fmt)[0])


ML = {
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn,
    "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
}


@common
@given(
    arrays(np.float32, 32, elements=finite),
    st.sampled_from(sorted(ML)),
    st.sampled_from(["floor", "rceil", "ceil", "even"]),
)
def test_outputs_are_scale_times_grid_point(x, fmt, rule):
    out = mx.quantize(torch.from_numpy(x), fmt, scale_rule=rule).numpy()
    amax = float(np.abs(x).max())
    if amax == 0.0:
        assert not out.any()
        return
    # whatever the rule, the scale is a power of two within a factor 4 of amax/2^emax
    base = math.floor(math.log2(amax)) - ELEM_FORMATS[fmt].emax
    assert any(
        np.array_equal((out / 2.0**s).astype(ML[fmt]).astype(np.float32), out / 2.0**s)
        for s in range(base - 1, base + 3)
    )
    assert np.all(np.abs(out) <= np.abs(x).max() * 2 + 1e-30)
