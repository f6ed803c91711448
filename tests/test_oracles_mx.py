"""MX scale rules against an independent reference on hand-picked blocks.

The reference takes the format facts from the OCP MX v1.0 table (exponent bias, mantissa
bits, emax, max normal), computes the shared exponent with exact float64 arithmetic
(frexp, no bit tricks) and rounds each element to the nearest value of an enumerated grid
(ties to the even code). The blocks are chosen where the rules disagree: block maxima that
are exact powers of two (CEIL = FLOOR there) and maxima whose mantissa rounds up at the
element's width (EVEN bumps the exponent), with small elements that show the scale.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mx

# name: (exponent bias, mantissa bits, emax, max normal), from the OCP MX v1.0 spec.
OCP = {
    "fp8_e4m3": (7, 3, 8, 448.0),
    "fp8_e5m2": (15, 2, 15, 57344.0),
    "fp6_e3m2": (3, 2, 4, 28.0),
    "fp6_e2m3": (1, 3, 2, 7.5),
    "fp4_e2m1": (1, 1, 2, 6.0),
}


def grid(fmt: str) -> np.ndarray:
    """Every non-negative finite value of the element format, ascending."""
    bias, mbits, _, max_normal = OCP[fmt]
    values = [m / 2**mbits * 2.0 ** (1 - bias) for m in range(2**mbits)]
    exp = 1
    while True:
        for m in range(2**mbits):
            value = (1 + m / 2**mbits) * 2.0 ** (exp - bias)
            if value > max_normal:
                return np.array(values)
            values.append(value)
        exp += 1


def floor_log2(value: float) -> int:
    return math.frexp(value)[1] - 1


def shared_exponent(amax: float, fmt: str, rule: str) -> int:
    """The block's scale exponent by the rule's definition (FLOOR: floor(log2 amax) − emax;
    CEIL: ceil(log2 amax) − emax; EVEN: amax rounded half-up to the element's mantissa
    width first, then FLOOR)."""
    _, mbits, emax, _ = OCP[fmt]
    k = floor_log2(amax)
    if rule == "floor":
        return k - emax
    if rule == "ceil":
        return (k if amax == 2.0**k else k + 1) - emax
    assert rule == "even"
    ulp = 2.0 ** (k - mbits)
    return floor_log2(math.floor(amax / ulp + 0.5) * ulp) - emax


def reference_quantize(block: list[float], fmt: str, exp: int) -> list[float]:
    values = grid(fmt)
    out = []
    for x in block:
        scaled = min(abs(x) / 2.0**exp, values[-1])
        i = int(np.searchsorted(values, scaled))
        if i == len(values) or values[i] != scaled:
            lo, hi = i - 1, min(i, len(values) - 1)
            d_lo, d_hi = scaled - values[lo], values[hi] - scaled
            i = lo if d_lo < d_hi or (d_lo == d_hi and lo % 2 == 0) else hi
        out.append(math.copysign(values[i] * 2.0**exp, x))
    return out


def block_for(amax: float, fmt: str) -> list[float]:
    """``amax`` first, then elements near the smallest subnormal of the FLOOR scale, where
    a scale twice as large rounds them differently."""
    bias, mbits, _, _ = OCP[fmt]
    tiny = 2.0 ** (shared_exponent(amax, fmt, "floor") + 1 - bias - mbits)
    return [amax, -0.3 * amax, *(tiny * f for f in (1.0, -1.5, 0.5, 0.75, 2.5, 3.0))]


# (format, block maximum, the rules that give the larger exponent)
CASES = [
    ("fp8_e4m3", 1.0, ()),  # a power of two: CEIL = FLOOR, EVEN = FLOOR
    ("fp8_e4m3", 1.5, ("ceil",)),
    ("fp8_e4m3", 1.9375, ("ceil", "even")),  # 1.1111b rounds up to 2 at 3 mantissa bits
    ("fp8_e4m3", 1.0625, ("ceil",)),  # 1.0001b: a half that rounds up, yet stays below 2
    ("fp8_e5m2", 2.0**-3, ()),
    ("fp8_e5m2", 0.2343750, ("ceil", "even")),  # 1.111b x 2^-3 at 2 mantissa bits
    ("fp6_e3m2", 12.0, ("ceil",)),
    ("fp6_e2m3", 7.9, ("ceil", "even")),
    ("fp4_e2m1", 3.5, ("ceil", "even")),  # 1.11b x 2 rounds to 4 at 1 mantissa bit
    ("fp4_e2m1", 4.0, ()),
]


@pytest.mark.parametrize(("fmt", "amax", "bumped"), CASES)
def test_reference_exponents_of_the_hand_picked_blocks(fmt, amax, bumped):
    floor = shared_exponent(amax, fmt, "floor")
    for rule in ("ceil", "even"):
        assert shared_exponent(amax, fmt, rule) == floor + (rule in bumped)


@pytest.mark.parametrize("rule", ["floor", "ceil", "even"])
@pytest.mark.parametrize(("fmt", "amax", "bumped"), CASES)
def test_quantize_matches_the_reference_scale_rule(fmt, amax, bumped, rule):
    block = block_for(amax, fmt)
    exp = shared_exponent(amax, fmt, rule)
    want = reference_quantize(block, fmt, exp)
    # The blocks discriminate: one exponent more or less gives other values.
    assert want != reference_quantize(block, fmt, exp + 1)
    assert want != reference_quantize(block, fmt, exp - 1)
    x = torch.tensor(block, dtype=torch.float32)
    got = mx.quantize(x, fmt, block_size=len(block), scale_rule=rule)
    assert got.tolist() == want
