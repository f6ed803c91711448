"""End to end on CPU under bf16 autocast (the code a GPU run takes): a micro MX LM grid with
bf16 parameters and a paired proxy grid, through `sweep launch`."""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest
from test_e2e_cli import sweep


def launch(tmp_path, repo_root, name: str, grid: str) -> dict[str, dict]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(grid.replace("GRIDS", str(repo_root / "tests" / "grids")))
    sweep_dir = tmp_path / name
    result = sweep("launch", str(path), "--sweep-dir", str(sweep_dir), cwd=repo_root)
    assert result.returncode == 0, result.stdout + result.stderr
    runs = {}
    for run_dir in (sweep_dir / "runs").iterdir():
        summary = json.loads((run_dir / "summary.json").read_text())
        table = pq.read_table(run_dir / "metrics").to_pandas()
        table["name"] = table["name"].astype(str)
        runs[summary["config"]] = {"summary": summary, "metrics": table}
    return runs


def series(table, name: str) -> list[float]:
    return table[table["name"] == name].sort_values("step")["value"].tolist()


LM_GRID = """
include: GRIDS/micro.yaml
name: autocast_lm
base: {train: {autocast: bf16, param_dtype: bf16}}
axes:
  budget: [4.0e+8]
  shape: [{d_model: 32, n_layers: 1}]
  precision:
    - {name: bf16, w_fmt: bf16, a_fmt: bf16, elementwise: bf16}
    - {name: mx_ln_mx, w_fmt: fp8_e4m3, a_fmt: fp8_e4m3, elementwise: bf16, ln: mx}
"""

PROXY_GRID = """
include: GRIDS/proxy_micro.yaml
name: autocast_proxy
base: {train: {autocast: bf16, steps: 30}}
"""


@pytest.mark.slow
def test_mx_lm_and_paired_proxy_grids_train_under_cpu_autocast(tmp_path, repo_root):
    lm = launch(tmp_path, repo_root, "lm", LM_GRID)
    assert sorted(lm) == ["bf16", "mx_ln_mx"]
    for run in lm.values():
        summary = run["summary"]
        assert summary["state"] == "done" and summary["steps_done"] == summary["total_steps"]
        assert (summary["autocast"], summary["param_dtype"]) == ("bf16", "bf16")
        loss = series(run["metrics"], "train/loss")
        assert all(math.isfinite(v) for v in loss) and loss[-1] < loss[0]

    proxy = launch(tmp_path, repo_root, "proxy", PROXY_GRID)
    assert sorted(proxy) == ["fp32", "mx_e4m3"]
    twins = []
    for run in proxy.values():
        assert run["summary"]["state"] == "done" and run["summary"]["autocast"] == "bf16"
        loss = series(run["metrics"], "train/loss")
        assert len(loss) == 30 and all(math.isfinite(v) for v in loss)
        twins.append(series(run["metrics"], "paired/fp32_loss"))
    # Both twins are the same FP32 run whatever their MX side did under autocast.
    assert twins[0] == twins[1] and len(twins[0]) == 30
    mx_loss = series(proxy["mx_e4m3"]["metrics"], "train/loss")
    assert mx_loss != twins[0]
