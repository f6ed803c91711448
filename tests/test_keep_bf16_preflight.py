"""``precision.keep_bf16`` globs are checked against the network at ``sweep plan`` and
``sweep launch`` (built on the meta device): a glob that matches nothing is exit 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from models.config import RunSpec
from models.precheck import unmatched_keep_bf16
from sweep.cli import app

GRID = """\
name: kb
base:
  model: {{vocab_size: 64, seq_len: 16, head_dim: 16, d_model: 16, n_layers: 2}}
  train: {{batch_size: 2, steps: 3}}
axes:
  precision:
    - {{w_fmt: fp8_e4m3, a_fmt: fp8_e4m3, keep_bf16: [head, "blocks.-1"]}}
    - {{w_fmt: fp8_e4m3, a_fmt: fp8_e4m3, keep_bf16: [{glob}]}}
"""


def _spec(keep: list[str], **model: object) -> RunSpec:
    return RunSpec.model_validate(
        {
            "model": {"vocab_size": 64, "seq_len": 16, "head_dim": 16, "d_model": 16, **model},
            "train": {"steps": 3},
            "precision": {"w_fmt": "fp8_e4m3", "keep_bf16": keep},
        }
    )


def test_globs_are_matched_on_the_meta_network():
    assert unmatched_keep_bf16(_spec(["head", "blocks.-1", "blocks.0.mlp.*"])) == ([], [])
    globs, names = unmatched_keep_bf16(_spec(["head", "lm_head", "blocks.3"], n_layers=2))
    assert globs == ["blocks.3", "lm_head"]
    assert {"head", "blocks.0", "blocks.1.mlp"} <= set(names)
    # The proxy's modules are its own.
    proxy = {"kind": "proxy", "depth": 2, "width": 16}
    proxy_spec = RunSpec.model_validate(
        {"model": proxy, "train": {"steps": 3}, "precision": {"keep_bf16": ["head"]}}
    )
    assert unmatched_keep_bf16(proxy_spec)[0] == ["head"]


@pytest.mark.parametrize("command", ["plan", "launch"])
def test_plan_and_launch_refuse_a_glob_that_matches_no_module(tmp_path, command):
    grid = tmp_path / "kb.yaml"
    grid.write_text(GRID.format(glob="lm_head"))
    sweep_dir = tmp_path / "sweep"
    extra = ["--sweep-dir", str(sweep_dir), "--executor", "local"] if command == "launch" else []
    result = CliRunner().invoke(app, [command, str(grid), *extra])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"{grid}: precision.keep_bf16: glob 'lm_head' matches no module" in message
    assert "module names look like: embed, blocks, final_norm, head," in message
    assert not sweep_dir.exists()
    grid.write_text(GRID.format(glob='"blocks.0.*"'))
    ok = CliRunner().invoke(app, ["plan", str(grid)])
    assert ok.exit_code == 0, ok.output
