"""Quantized evaluation and LOTION on FSDP shards: the cast and the smoothing term see whole
weights (NVFP4's tensor scale spans the shards), so a 2-rank FSDP run records the
single-process metrics, val/loss_quantized and lotion/penalty included."""

from __future__ import annotations

import pytest
from test_distributed import (
    assert_same_trajectory,
    make_spec,
    reference,
    run_torchrun,
    write_run,
)

__all__ = ["reference"]  # the fixture, used below


@pytest.mark.slow
@pytest.mark.parametrize("lotion", [None, "second_order", "monte_carlo"])
def test_fsdp_quantized_eval_follows_the_single_process_run(tmp_path, reference, lotion):
    # Without clipping, as the FSDP equivalence test in test_distributed (bit for bit here).
    train = {"quantized_eval": "nvfp4"}
    if lotion is not None:
        train["lotion"] = {"fmt": "nvfp4", "form": lotion}
    spec = make_spec(tasks=2, strategy="fsdp", grad_clip=0.0, steps=20, **train)
    expected = reference(spec)
    assert {s for (n, s) in expected if n == "val/loss_quantized"} == {10, 20}
    assert any(n == "lotion/penalty" for n, _ in expected) == (lotion == "second_order")
    run_dir = write_run(tmp_path, spec)
    run_torchrun(run_dir)
    assert_same_trajectory(run_dir, expected)
