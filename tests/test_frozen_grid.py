"""The sweep folder freezes the merged grid (includes resolved): `sweep intervene` reads the
launch section the sweep ran with even when it came from an included file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from sweep.grid import LaunchSettings, expand_grid, load_grid
from sweep.intervene import intervene
from sweep.launch import LaunchOptions, launch

BASE = {
    "model": {"kind": "proxy", "depth": 1, "width": 8},
    "train": {"steps": 4, "batch_size": 4, "log_every": 1, "eval_every": 4, "eval_batches": 1},
}


def _grids(tmp_path: Path) -> Path:
    """A top grid whose base and launch section come from an included file."""
    common = {"base": BASE, "launch": {"executor": "ray", "max_retries": 3}}
    (tmp_path / "common.yaml").write_text(yaml.safe_dump(common))
    top = {"include": "common.yaml", "name": "frozen", "axes": {"seed": [0]}}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(top))
    return path


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> tuple[Path, Path]:
    """(grid file, sweep folder) of the grid launched once (one 4-step proxy run)."""
    tmp_path = tmp_path_factory.mktemp("frozen")
    grid, sweep_dir = _grids(tmp_path), tmp_path / "sweep"
    result = launch(grid, sweep_dir, LaunchOptions(LaunchSettings(executor="local", workers=1)))
    assert [s.executor for s in result.submissions] == ["local"]
    return grid, sweep_dir


def _intervene_executor(sweep_dir: Path) -> str:
    (parent,) = [p.name for p in (sweep_dir / "runs").iterdir()]
    result, _ = intervene(sweep_dir, [parent], "2", [], ["control"], LaunchOptions(dry_run=True))
    return result.executor


def test_intervene_sees_a_launch_section_from_an_included_file(launched):
    _, sweep_dir = launched
    frozen = load_grid(sweep_dir / "grid.yaml")
    assert frozen.launch.executor == "ray" and frozen.launch.max_retries == 3
    assert _intervene_executor(sweep_dir) == "ray"


def test_the_frozen_grid_expands_to_the_launched_runs(launched):
    grid, sweep_dir = launched
    runs = expand_grid(load_grid(grid)).runs
    frozen = expand_grid(load_grid(sweep_dir / "grid.yaml")).runs
    assert [s.run_id for s in frozen] == [s.run_id for s in runs]
    assert sorted(p.name for p in (sweep_dir / "runs").iterdir()) == [runs[0].run_id]


def test_an_old_folder_with_the_top_file_frozen_keeps_its_launch_section(launched, tmp_path):
    sweep_dir = tmp_path / "old"
    shutil.copytree(launched[1], sweep_dir)
    # Folders launched before the merged grid was frozen hold the top file as written.
    old_top = {"include": "common.yaml", "name": "frozen", "launch": {"executor": "ray"}}
    (sweep_dir / "grid.yaml").write_text(yaml.safe_dump(old_top))
    assert _intervene_executor(sweep_dir) == "ray"
