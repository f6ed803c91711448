"""Regenerate the paper-op fixtures from the paper's own code (not part of the test suite).

    G=/work/.mirror/Hither1+systems-scaling/repo
    git --git-dir=$G archive HEAD olmo/mx | tar -x -C /tmp/paper
    python tests/data/paper_ops/make_fixtures.py /tmp/paper/olmo tests/data/paper_ops/fixtures.pt

Runs the paper's pure-PyTorch path on CPU (its `mx` package first on sys.path) on fixed
inputs and saves inputs and outputs; nothing of its code is kept. fixtures.pt was made from
Hither1/systems-scaling at commit 8aa0ac8ada5a61276b7bc71b89e1872bb82b56e2 with torch 2.13.0 (CPU).
"""

from __future__ import annotations

import sys

import torch


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(3, 32, 64, generator=g) * torch.logspace(-2, 1, 64)
    w = torch.randn(48, 64, generator=g) * 0.2
    w[3, :32] *= 30.0  # a block with a large max so the bump and clipping matter
    b = torch.randn(48, generator=g) * 0.1
    gy = torch.randn(3, 32, 48, generator=g) * 1e-3
    ln_x = torch.randn(80, 64, generator=g) * 3.0 + 0.5
    ln_w = 1.0 + 0.1 * torch.randn(64, generator=g)
    ln_b = 0.05 * torch.randn(64, generator=g)
    ln_gy = torch.randn(80, 64, generator=g) * 1e-2
    bump = torch.randn(6, 96, generator=g) * torch.logspace(-3, 3, 96)
    # mantissas near 1.75 and just below a power of two (where float log2 rounds up)
    bump[0, :8] = torch.tensor([1.75, 1.7500001, 1.76, 1.99, 1.9999999, 3.5, 3.6, 0.0])
    return dict(x=x, w=w, b=b, gy=gy, ln_x=ln_x, ln_w=ln_w, ln_b=ln_b, ln_gy=ln_gy, bump=bump)


LINEAR_CASES = {
    # x is (batch, seq, d) with seq a multiple of 32: the paper blocks the weight-gradient
    # operands along seq per sequence, which equals our blocking over flattened tokens then.
    # name: paper spec overrides (the paper's proxy arms, olmo/synthetic/make_intervention_sweep.py)
    "mx": {},
    "bf16_act": {"a_elem_format": "bfloat16"},
    "bf16_weight": {"w_elem_format": "bfloat16"},
    "no_bp_quant": {"quantize_backprop": False},
    # 2-D input, as in the proxy (where the paper ran the bump): its weight-gradient bump
    # takes the max over the blocks of the whole batch.
    "bump": {"bump_up_overflow_exponent": True},
}
TWO_D = {"bump"}


def main(paper_olmo: str, out: str) -> None:
    sys.path.insert(0, paper_olmo)
    from mx.layernorm import layer_norm
    from mx.linear import linear
    from mx.mx_ops import _quantize_mx
    from mx.specs import finalize_mx_specs

    from mx.formats import ElemFormat

    def specs(**over):
        base = {
            "w_elem_format": "fp8_e4m3",
            "a_elem_format": "fp8_e4m3",
            "w_elem_format_bp": "fp8_e4m3",
            "a_elem_format_bp_ex": "fp8_e4m3",
            "a_elem_format_bp_os": "fp8_e4m3",
            "block_size": 32,
            "scale_bits": 8,
            "custom_cuda": False,
            "quantize_backprop": True,
            "bfloat": 16,
            "bump_up_overflow_exponent": False,
            "dont_quantize_layernorm": False,
            "dont_quantize_gelu": False,
        }
        return finalize_mx_specs({**base, **over})

    data = _inputs()
    res: dict[str, torch.Tensor] = dict(data)
    for axis in (-1, 0):
        res[f"bump_out_axis{axis}"] = _quantize_mx(
            data["bump"],
            8,
            ElemFormat.fp8_e4m3,
            axes=[axis],
            block_size=32,
            round="nearest",
            bump_up_overflow_exponent=True,
        )
    for name, over in LINEAR_CASES.items():
        shape_x, shape_g = (-1, 64), (-1, 48)
        if name not in TWO_D:
            shape_x, shape_g = data["x"].shape, data["gy"].shape
        x = data["x"].reshape(shape_x).clone().requires_grad_()
        w = data["w"].clone().requires_grad_()
        b = data["b"].clone().requires_grad_()
        y = linear(x, w, b, mx_specs=specs(**over))
        y.backward(data["gy"].reshape(shape_g))
        res.update(
            {
                f"lin_{name}_y": y.detach(),
                f"lin_{name}_gx": x.grad,
                f"lin_{name}_gw": w.grad,
                f"lin_{name}_gb": b.grad,
            }
        )
    for name, over in {
        "bf16": {},
        "noq": {"dont_quantize_layernorm": True},
        "no_bp_quant": {"quantize_backprop": False},
    }.items():
        x = data["ln_x"].clone().requires_grad_()
        w = data["ln_w"].clone().requires_grad_()
        b = data["ln_b"].clone().requires_grad_()
        y = layer_norm(x, w.shape, w, b, 1e-5, mx_specs=specs(**over))
        y.backward(data["ln_gy"])
        assert b.grad is None  # the paper's LayerNorm returns no bias gradient
        res.update({f"ln_{name}_y": y.detach(), f"ln_{name}_gx": x.grad, f"ln_{name}_gw": w.grad})
    torch.save(res, out)
    print(f"wrote {out}: {len(res)} tensors")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
