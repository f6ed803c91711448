"""NVFP4 bit-exact against torchao's NVFP4Tensor; 16x16 weight tiles; clip rate."""

import pytest
import torch

import mx
from mx.nvfp4 import quantize_nvfp4

nvfp4 = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")


def _torchao(x: torch.Tensor) -> torch.Tensor:
    scale = nvfp4.per_tensor_amax_to_scale(x.abs().max())
    return nvfp4.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=scale).dequantize(torch.float32)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.float().view(torch.int32), b.float().view(torch.int32))


FIXED = {
    # One block at the top of the range, E2M1 ties (RNE), negatives, a zero.
    "ties": [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, 0, 4, 3, 1, 0.5],
    # A block whose E4M3 scale rounds down: its max is clamped to 6 (saturation).
    "saturate": [2688.0] + [0.0] * 15 + [14.9] + [1.0] * 15,
    # A tiny block next to a huge one: its scale clamps at E4M3's smallest normal.
    "tiny": [1e4] + [1.0] * 15 + [1e-3, -2e-3, 1e-30, 0.0] * 4,
    "zeros_block": [0.0] * 16 + [3.0, -1.0] * 8,
}


@pytest.mark.parametrize("case", sorted(FIXED))
def test_fixed_tensors_bit_exact_against_torchao(case):
    x = torch.tensor([FIXED[case]])
    assert _same_bits(mx.quantize(x, "nvfp4"), _torchao(x))


@pytest.mark.parametrize("seed", range(6))
def test_random_tensors_bit_exact_against_torchao(seed):
    gen = torch.Generator().manual_seed(seed)
    # Rows spanning ~10 decades so block scales cover much of the E4M3 range.
    x = torch.randn(32, 128, generator=gen) * torch.exp(torch.randn(32, 1, generator=gen) * 4)
    x[3] = 0.0
    x[5, :16] = 1e-38
    q = mx.quantize(x, "nvfp4")
    assert _same_bits(q, _torchao(x))
    xb = x.bfloat16()
    # bf16 in, bf16 out: the float32 result cast once.
    assert _same_bits(mx.quantize(xb, "nvfp4"), _torchao(xb).bfloat16())
    # The grid: every value is (tensor scale x block scale) x an E2M1 value.
    assert q.abs().max() <= x.abs().max()


def test_all_zero_tensor_stays_zero():
    # torchao divides 0/0 here and returns NaN; NVIDIA's scale rule leaves zeros.
    assert torch.equal(mx.quantize(torch.zeros(2, 32), "nvfp4"), torch.zeros(2, 32))


def test_axis_ragged_and_nan_blocks():
    x = torch.randn(40, 24)
    along0 = mx.quantize(x, "nvfp4", axis=0)
    assert torch.equal(along0, mx.quantize(x.t().contiguous(), "nvfp4").t())
    padded = torch.cat([x, torch.zeros(40, 8)], 1)
    assert torch.equal(mx.quantize(x, "nvfp4"), mx.quantize(padded, "nvfp4")[:, :24])
    x[0, 3] = float("nan")
    q = mx.quantize(x, "nvfp4")
    assert q[0, :16].isnan().all() and not q[0, 16:].isnan().any() and not q[1:].isnan().any()


def _tile_reference(w: torch.Tensor) -> torch.Tensor:
    """Independent 16x16-tile NVFP4: same scale math per 256-element tile, E2M1 by lookup."""
    grid = torch.tensor([0.0, 0.5, 1, 1.5, 2, 3, 4, 6])
    s_t = w.abs().max() / 2688.0
    out = torch.empty_like(w)
    for i in range(0, w.shape[0], 16):
        for j in range(0, w.shape[1], 16):
            tile = w[i : i + 16, j : j + 16]
            s_b = (tile.abs().max() / 6.0 / s_t).clamp(2**-6, 448).to(torch.float8_e4m3fn).float()
            scaled = (tile * ((1.0 / s_t) / s_b)).abs().clamp_max(6.0)
            # nearest grid value, ties to the even code (lower index parity)
            dist = (scaled.unsqueeze(-1) - grid).abs()
            best = dist.min(-1, keepdim=True).values
            candidates = torch.where(dist == best, torch.arange(8), 99)
            idx = torch.where(candidates % 2 == 0, candidates, 99).min(-1).values
            idx = torch.where(idx == 99, candidates.min(-1).values, idx)
            out[i : i + 16, j : j + 16] = torch.copysign(grid[idx], tile) * (s_t * s_b)
    return out


def test_16x16_weight_tiles():
    w = torch.randn(48, 32) * torch.exp(torch.randn(48, 1))
    tiled = quantize_nvfp4(w, layout="16x16")
    assert torch.equal(tiled, _tile_reference(w))
    # One quantization serves W and W^T (the point of 2-D blocks for weights).
    assert torch.equal(quantize_nvfp4(w.t(), layout="16x16"), tiled.t())
    assert not torch.equal(tiled, mx.quantize(w, "nvfp4"))
    with pytest.raises(ValueError, match="2-D"):
        quantize_nvfp4(torch.ones(2, 16, 16), layout="16x16")


def test_clip_rate_counts_blocks_whose_scale_rounded_down():
    x = torch.tensor([FIXED["saturate"]])
    # Block 2: 14.9/6 relative to the tensor scale rounds down in E4M3, so its max clips.
    assert mx.clip_rate(x, "nvfp4") == 1 / 32
    assert mx.clip_rate(torch.tensor([FIXED["ties"]]), "nvfp4") == 0.0
