"""Quantized evaluation on FSDP shards: the cast sees whole weights (NVFP4's tensor scale
spans the shards), so a 2-rank FSDP run records the single-process val/loss_quantized."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_distributed import ROOT, assert_same_trajectory, make_spec, reference, write_run

__all__ = ["reference"]  # the fixture, used below


@pytest.mark.slow
def test_fsdp_quantized_eval_follows_the_single_process_run(tmp_path, reference):
    # Without clipping, as the FSDP equivalence test in test_distributed (bit for bit here).
    spec = make_spec(tasks=2, strategy="fsdp", grad_clip=0.0, steps=20, quantized_eval="nvfp4")
    expected = reference(spec)
    assert {s for (n, s) in expected if n == "val/loss_quantized"} == {10, 20}
    run_dir = write_run(tmp_path, spec)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    result = subprocess.run(
        [*torchrun, "--nproc-per-node", "2", "-m", "sweep.run", str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_trajectory(run_dir, expected)
