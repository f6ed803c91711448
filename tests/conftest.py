"""Shared test settings: one thread per process keeps timings sane on 2-core machines."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def slurm_required() -> None:
    """Skip without a SLURM that answers; FAIL instead when CI is set to anything truthy
    (.ci/run promises a cluster there, so a broken bring-up must not pass as skips)."""
    from executor_fixtures import ci_is_set

    from sweep.executors.slurm import slurm_available

    if slurm_available():
        return
    if ci_is_set():
        pytest.fail("CI is set but no SLURM answers (sbatch missing or `scontrol ping` fails)")
    pytest.skip("no running SLURM: start one with `slurm/local-cluster.sh up`")
