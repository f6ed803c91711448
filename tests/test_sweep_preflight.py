"""Preflight: doomed launches are refused with exit 2 before anything is written."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import sweep.preflight as preflight_module
from models.config import RunSpec
from sweep.errors import GridError
from sweep.grid import LaunchSettings
from sweep.launch import LaunchOptions, launch
from sweep.preflight import (
    check_cluster,
    check_data,
    parse_associations,
    parse_gpus,
    parse_sinfo,
    parse_time_limit,
)

# `sinfo -h -o '%P|%l|%c|%m|%G'` on a cluster with two GPU node types (captured format).
SINFO = """\
debug*|1:00:00|64|257000|(null)
gpu|2-00:00:00|128|1031000|gpu:a100:8(S:0-1)
gpu|2-00:00:00|96|515000+|gpu:a100:4(S:0)
long|infinite|64+|257000|(null)
"""
# `sacctmgr -n -P show assoc user=alice format=Account,QOS`
SACCTMGR = "proj1|normal,high\nproj2|normal\n"


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _token_spec(path: Path, vocab: int = 1000, dtype: str = "uint16", gpus: int = 0, **res):
    return RunSpec.model_validate(
        {
            "model": {"d_model": 32, "head_dim": 32, "vocab_size": vocab, "seq_len": 16},
            "data": {
                "kind": "tokens",
                "train": [str(path)],
                "validation": [str(path)],
                "dtype": dtype,
            },
            "train": {"steps": 5, "batch_size": 8},
            "resources": {"gpus": gpus, **res},
        }
    )


def test_token_files_checked_for_existence_size_dtype_and_vocab(tmp_path):
    good = tmp_path / "good.bin"
    np.arange(500, dtype=np.uint16).tofile(good)
    check_data("g.yaml", [_token_spec(good)])
    with pytest.raises(GridError, match=r"missing.bin: does not exist"):
        check_data("g.yaml", [_token_spec(tmp_path / "missing.bin")])
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(GridError, match="is empty"):
        check_data("g.yaml", [_token_spec(empty)])
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x00" * 101)
    with pytest.raises(GridError, match="not a multiple of 2 \\(uint16\\)"):
        check_data("g.yaml", [_token_spec(odd)])
    short = tmp_path / "short.bin"
    np.arange(10, dtype=np.uint16).tofile(short)
    with pytest.raises(GridError, match="holds 10 tokens; at least 17"):
        check_data("g.yaml", [_token_spec(short)])
    with pytest.raises(GridError, match=r"token id 499 >= model.vocab_size=256"):
        check_data("g.yaml", [_token_spec(good, vocab=256)])
    wide = tmp_path / "wide.bin"
    np.arange(500, dtype=np.uint32).tofile(wide)
    check_data("g.yaml", [_token_spec(wide, dtype="uint32")])


def test_large_files_are_sampled_and_cached_by_size_and_mtime(tmp_path, monkeypatch):
    big = tmp_path / "big.bin"
    tokens = np.zeros(5_000_000, dtype=np.uint16)
    tokens[-3] = 40_000  # in the last sampled chunk
    tokens.tofile(big)
    calls = []
    real = preflight_module.sample_max_id
    monkeypatch.setattr(preflight_module, "sample_max_id", lambda *a: calls.append(a) or real(*a))
    with pytest.raises(GridError, match="token id 40000"):
        check_data("g.yaml", [_token_spec(big, vocab=32000)])
    check_data("g.yaml", [_token_spec(big, vocab=50000)])
    assert len(calls) == 2  # a refusal raises before the cache is written: sampled again
    check_data("g.yaml", [_token_spec(big, vocab=50000)])
    assert len(calls) == 2  # cached now
    os.utime(big, ns=(1, 1))
    check_data("g.yaml", [_token_spec(big, vocab=50000)])
    assert len(calls) == 3  # the file changed: checked again


def test_parsers_read_real_format_output():
    parts = parse_sinfo(SINFO)
    assert sorted(parts) == ["debug", "gpu", "long"]
    assert parts["debug"].time_limit_min == 60 and parts["long"].time_limit_min is None
    # The smaller GPU node bounds what a run may ask for.
    assert (parts["gpu"].cpus, parts["gpu"].gpus, parts["gpu"].mem_mb) == (96, 4, 515000)
    assert parts["gpu"].time_limit_min == 2 * 1440
    assert parse_time_limit("30") == 30 and parse_time_limit("1-02:03:00") == 1440 + 123
    assert parse_time_limit("05:30") == 5.5  # minutes:seconds
    assert parse_gpus("gpu:h100:4(S:0-1),shard:8") == 4 and parse_gpus("(null)") == 0
    assert parse_associations(SACCTMGR) == ({"proj1", "proj2"}, {"normal", "high"})


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, out in (("sinfo", SINFO), ("sacctmgr", SACCTMGR)):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho {name} >> {tmp_path}/calls\ncat <<'EOF'\n{out}EOF\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return tmp_path / "calls"


def test_cluster_checks_partition_account_qos_and_fit(tmp_path, fake_slurm):
    good = tmp_path / "good.bin"
    np.arange(500, dtype=np.uint16).tofile(good)
    fits = _token_spec(good, gpus=4, cpus=8, time_min=600)
    check_cluster("g.yaml", [fits], "gpu", "proj1", "high")
    assert fake_slurm.read_text().split() == ["sinfo", "sacctmgr"]  # one call each
    cases = [
        (
            ([fits], "gpu2", None, None),
            "launch.partition 'gpu2' does not exist; partitions: debug, gpu, long",
        ),
        (([fits], "gpu", "proj9", None), "launch.account 'proj9' is not one of yours"),
        (([fits], "gpu", "proj1", "vip"), "launch.qos 'vip' is not one you may use"),
        (
            ([_token_spec(good, gpus=8, time_min=60)], "gpu", None, None),
            "resources.gpus=8 per node > 4",
        ),
        (
            ([_token_spec(good, time_min=90)], None, None, None),  # the default partition: debug
            "resources.time_min=90 > the partition's 60 min",
        ),
        (([_token_spec(good, gpus=4, cpus=32)], "gpu", None, None), "128 CPUs per node"),
        (([_token_spec(good, mem_gb=600)], "long", None, None), "resources.mem_gb=600 > 251 GB"),
    ]
    for args, needle in cases:
        with pytest.raises(GridError, match=None) as err:
            check_cluster("g.yaml", *args)
        assert needle in str(err.value)


def test_launch_refuses_before_writing_anything(tmp_path, fake_slurm):
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        "name: pf\nbase: {model: {vocab_size: 64, seq_len: 16, head_dim: 16, d_model: 16},"
        f" data: {{kind: tokens, train: [{tmp_path}/none.bin], validation: [{tmp_path}/none.bin]}},"
        " train: {batch_size: 2, steps: 3}}\naxes: {seed: [0]}\n"
    )
    sweep_dir = tmp_path / "sweep"
    with pytest.raises(GridError, match="none.bin: does not exist"):
        launch(grid, sweep_dir, LaunchOptions(LaunchSettings(executor="local")))
    tokens = tmp_path / "none.bin"
    np.arange(100, dtype=np.uint16).tofile(tokens)  # ids up to 99 >= vocab 64
    with pytest.raises(GridError, match="token id 99 >= model.vocab_size=64"):
        launch(grid, sweep_dir, LaunchOptions(LaunchSettings(executor="slurm", partition="nope")))
    np.arange(60, dtype=np.uint16).tofile(tokens)
    with pytest.raises(GridError, match="launch.partition 'nope' does not exist"):
        launch(grid, sweep_dir, LaunchOptions(LaunchSettings(executor="slurm", partition="nope")))
    assert not sweep_dir.exists()
