"""mx.quantize / mx.clip_rate: reference-doc vectors, oracles (ml_dtypes, torchao), errors."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch

import mx
from mx import fast
from mx.formats import ELEM_FORMATS
from mx.quantizer import e8m0_ceil_exponent

E4M3 = "fp8_e4m3"


def block(values, size: int = 32) -> torch.Tensor:
    """A 1-D fp32 block: ``values`` followed by zeros."""
    out = torch.zeros(size)
    out[: len(values)] = torch.tensor(values, dtype=torch.float32)
    return out


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.float().view(torch.int32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, except that any NaN payload equals any other NaN."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(bits(a)[~nan], bits(b)[~nan])


# --- test vectors from mx-formats.md -------------------------------------------------


def test_e2m1_ties_round_to_even_at_scale_one():
    # amax 5 -> FLOOR scale 2^(2-2) = 1
    x = block([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    got = mx.quantize(x, "fp4_e2m1")[:7].tolist()
    assert got == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_e4m3_saturates_464_to_448():
    assert mx.quantize(block([464.0]), E4M3)[0].item() == 448.0


def test_reference_block_even_and_half_away():
    vals = [485, 475, 400, -485, -475, -450, 2**-6, -(2**-6)]
    want = [448, 448, 384, -448, -448, -448, 2**-6, -(2**-6)]
    assert mx.quantize(block(vals), E4M3)[:8].tolist() == want
    want[2] = 416
    assert mx.quantize(block(vals), E4M3, rounding="half_away")[:8].tolist() == want


def test_amax_960_floor_vs_rceil():
    x = block([957.0, 960.0, -959.56])
    assert mx.quantize(x, E4M3)[:3].tolist() == [896, 896, -896]
    assert mx.quantize(x, E4M3, scale_rule="rceil")[0].item() == 960


def test_e2m1_floor_clamps_block_max_rceil_does_not():
    x = block([7.9, 1.0])
    assert mx.quantize(x, "fp4_e2m1")[:2].tolist() == [6.0, 1.0]
    assert mx.quantize(x, "fp4_e2m1", scale_rule="rceil")[:2].tolist() == [8.0, 1.0]


def test_all_480_block():
    x = torch.full((32,), 480.0)
    x[::2] *= -1
    assert mx.quantize(x, E4M3).abs().unique().tolist() == [448.0]
    assert mx.quantize(x, E4M3, scale_rule="rceil").abs().unique().tolist() == [480.0]


def test_zero_block_and_tiny_value_keeps_sign():
    assert torch.equal(mx.quantize(torch.zeros(64), E4M3), torch.zeros(64))
    x = block([1.0, -(2.0**-149), 2.0**-149])
    out = mx.quantize(x, E4M3)
    assert out[:3].tolist() == [1.0, 0.0, 0.0]
    assert torch.signbit(out[1]) and not torch.signbit(out[2])


@pytest.mark.parametrize(
    ("pattern", "byte"),
    [
        (0x00400000, 0),
        (0x00400001, 1),
        (0x3F800000, 127),
        (0x3F800001, 128),
        (0x7F000000, 254),
        (0x7F000001, 255),
    ],
)
def test_rceil_scale_bytes(pattern, byte):
    assert e8m0_ceil_exponent(torch.tensor([pattern], dtype=torch.int32)).item() == byte


def test_nan_or_inf_poisons_only_its_block():
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = torch.ones(64)
        x[3] = bad
        out = mx.quantize(x, E4M3)
        assert torch.isnan(out[:32]).all()
        assert torch.equal(out[32:], torch.ones(32))


def test_int8_grid_and_symmetric_saturation():
    x = block([1.0, -1.0, 1.0 / 128, 3.0 / 128, 1.999, -1.999])
    got = mx.quantize(x, "int8")[:6].tolist()
    # scale 2^0: step 1/64, ties to even, clamp to +-127/64 (never -2)
    assert got == [1.0, -1.0, 0.0, 2 / 64, 127 / 64, -127 / 64]


# --- oracles --------------------------------------------------------------------------

ML_DTYPES = {
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
    "fp6_e3m2": ml_dtypes.float6_e3m2fn,
    "fp6_e2m3": ml_dtypes.float6_e2m3fn,
    "fp4_e2m1": ml_dtypes.float4_e2m1fn,
}


def oracle(x: np.ndarray, fmt: str) -> np.ndarray:
    """FLOOR-rule MX with RNE via numpy frexp and ml_dtypes casts, blocks of 32 on axis -1."""
    info = ELEM_FORMATS[fmt]
    blocks = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    exp = np.frexp(amax)[1] - 1  # floor(log2(amax)) for normal fp32
    scale = np.ldexp(np.float32(1), np.clip(exp - info.emax, -127, 127)).astype(np.float32)
    scaled = np.clip(blocks / scale, -info.max_normal, info.max_normal)
    if fmt == "int8":
        elems = np.round(scaled * 64) / 64  # numpy rounds half to even
    else:
        elems = scaled.astype(ML_DTYPES[fmt]).astype(np.float32)
    return (elems * scale).reshape(x.shape)


@pytest.mark.parametrize("fmt", sorted(ELEM_FORMATS))
def test_matches_ml_dtypes_oracle(fmt):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=gen) * torch.logspace(-3, 3, 256)
    # exact ties of the element grid occur with low-precision inputs
    x = torch.cat([x, x.bfloat16().float()])
    np.testing.assert_array_equal(mx.quantize(x, fmt).numpy(), oracle(x.numpy(), fmt))


TORCHAO_DTYPES = {
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "fp6_e3m2": "fp6_e3m2",
    "fp6_e2m3": "fp6_e2m3",
    "fp4_e2m1": torch.float4_e2m1fn_x2,
}


@pytest.mark.parametrize("fmt", sorted(TORCHAO_DTYPES))
@pytest.mark.parametrize("rule", ["floor", "rceil"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_torchao(fmt, rule, dtype):
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(32, 128, generator=gen) * torch.logspace(-4, 4, 128)).to(dtype)
    config = pytest.importorskip("torchao.prototype.mx_formats.config")
    torchao_mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    mode = config.ScaleCalculationMode[rule.upper()]
    ref = torchao_mx.MXTensor.to_mx(x, TORCHAO_DTYPES[fmt], 32, scaling_mode=mode)
    want = ref.dequantize(torch.float32)
    got = mx.quantize(x, fmt, scale_rule=rule)
    assert got.dtype == dtype
    assert torch.equal(bits(got), bits(want.to(dtype)))


# --- layout, dtypes, fast path ---------------------------------------------------------


def test_axis_blocks_and_ragged_padding():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 70, 5, generator=gen)
    along1 = mx.quantize(x, E4M3, axis=1)
    moved = mx.quantize(x.transpose(1, 2).contiguous(), E4M3).transpose(1, 2)
    assert torch.equal(along1, moved)
    # the ragged tail (6 elements) is its own block, padding does not touch the others
    head = mx.quantize(x[:, :64].transpose(1, 2).contiguous(), E4M3).transpose(1, 2)
    assert torch.equal(along1[:, :64], head)
    assert not torch.equal(mx.quantize(x, E4M3, axis=0), mx.quantize(x, E4M3, axis=-1))


def test_elementwise_formats():
    x = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 70000.0, 2.0**-20])
    assert torch.equal(mx.quantize(x, "bf16"), x.bfloat16().float())
    assert mx.quantize(x, "bf16", rounding="half_away")[:2].tolist() == [1.0 + 2**-7, 1 + 2**-6]
    assert torch.equal(mx.quantize(x, "fp16"), x.half().float())
    half_away = mx.quantize(x, "fp16", rounding="half_away")
    assert half_away[2].item() == float("inf") and half_away[3].item() == 2.0**-20
    assert mx.quantize(x, "fp32") is x


@pytest.mark.parametrize(
    ("fmt", "rule", "rounding"),
    [
        (E4M3, "floor", "even"),
        ("int8", "ceil", "half_away"),
        ("bf16", "floor", "half_away"),
        pytest.param("fp16", "floor", "half_away", marks=pytest.mark.slow),
        pytest.param(E4M3, "rceil", "half_away", marks=pytest.mark.slow),
        pytest.param("fp4_e2m1", "even", "even", marks=pytest.mark.slow),
    ],
)
def test_fast_path_is_bit_identical(fmt, rule, rounding):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(256, 300, generator=gen) * torch.logspace(-30, 30, 300)
    x[7, 40] = float("nan")
    previous = fast.get_mode()
    try:
        fast.set_mode("off")
        ref = mx.quantize(x, fmt, scale_rule=rule, rounding=rounding, axis=0)
        ref_rate = mx.clip_rate(x, fmt, scale_rule=rule)
        fast.set_mode("on")
        assert same_bits(mx.quantize(x, fmt, scale_rule=rule, rounding=rounding, axis=0), ref)
        assert mx.clip_rate(x, fmt, scale_rule=rule) == ref_rate
    finally:
        fast.set_mode(previous)


def test_clip_rate_counts_saturated_elements():
    x = block([485, 475, 400, -485, 1.0])  # FLOOR scale 1: 3 of 32 exceed 448
    assert mx.clip_rate(x, E4M3) == 3 / 32
    assert mx.clip_rate(x, E4M3, scale_rule="rceil") == 0.0
    assert mx.clip_rate(x, "bf16") == 0.0


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"fmt": "fp7"}, "fp7"),
        ({"fmt": E4M3, "block_size": 0}, "block_size"),
        ({"fmt": E4M3, "axis": 2}, "axis 2"),
        ({"fmt": E4M3, "scale_rule": "up"}, "floor"),
        ({"fmt": E4M3, "rounding": "up"}, "stochastic"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        mx.quantize(torch.ones(2, 32), **kwargs)
    if "fmt" in kwargs and kwargs["fmt"] == E4M3 and "rounding" not in kwargs:
        with pytest.raises(ValueError, match=needle):
            mx.clip_rate(torch.ones(2, 32), **kwargs)
    if kwargs.get("block_size") == 0 or "axis" in kwargs:  # checked for every format
        with pytest.raises(ValueError, match=needle):
            mx.quantize(torch.ones(2, 32), **{**kwargs, "fmt": "bf16"})


def test_spec_import_does_not_import_torch():
    code = "import mx.spec; from mx import PrecisionSpec; import sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
