"""`python -m bench.gpu_check --device cpu --quick`: the GPU check's own code, run small on CPU
so it cannot rot before the day a GPU runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_gpu_check_cpu_quick_mode_passes_and_writes_its_report(tmp_path, repo_root):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--quick"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(repo_root)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout and "MX/bf16 step time" in result.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["device"] == "cpu" and report["quick"] and report["ok"]
    checks = report["checks"]
    assert {name for name, check in checks.items() if check["ok"]} == {
        "lm_steps",
        "quantizer",
        "paired_proxy",
        "process_group",
        "determinism",
    }
    lm = checks["lm_steps"]
    assert lm["mx_over_bf16"] == pytest.approx(
        lm["runs"]["mxfp8_e4m3"]["step_s"] / lm["runs"]["bf16"]["step_s"]
    )
    assert all(run["tokens_per_s"] > 0 for run in lm["runs"].values())
    assert checks["quantizer"]["bit_identical_to_eager"] and checks["quantizer"]["gb_per_s"] > 0
    assert checks["paired_proxy"]["twin_equals_fp32"]
    assert "FSDP" in checks["process_group"]["wrapper"]
    group = checks["process_group"]
    assert group["loss_in_group"] == group["loss_alone"]
    assert checks["determinism"]["proxy_identical"] and checks["determinism"]["lm_identical"]
