"""Atomic writes are temp file + rename: while a write is under way the target still holds
the old content, a reader holding the old file keeps it, and no temp file is left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runfolder.atomic import atomic_write, atomic_write_json


def test_target_keeps_the_old_content_until_the_write_is_complete(tmp_path):
    target = tmp_path / "state.json"
    atomic_write_json(target, {"state": "running"})
    seen_during = []

    def slow_write(tmp: str) -> None:
        Path(tmp).write_text('{"state": ')
        seen_during.append(target.read_text())  # a concurrent reader, mid-write
        with open(tmp, "a") as handle:
            handle.write('"done"}')

    atomic_write(target, slow_write)
    assert json.loads(seen_during[0]) == {"state": "running"}
    assert json.loads(target.read_text()) == {"state": "done"}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_the_new_file_replaces_the_old_one_by_rename(tmp_path):
    target = tmp_path / "summary.json"
    atomic_write_json(target, {"v": 1})
    before = target.stat().st_ino
    with open(target) as old_reader:
        atomic_write_json(target, {"v": 2})
        # A rename gives the name a new inode; the open handle still reads the old file.
        assert json.loads(old_reader.read()) == {"v": 1}
    assert target.stat().st_ino != before
    assert json.loads(target.read_text()) == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    target = tmp_path / "state.json"
    atomic_write_json(target, {"state": "running"})

    def crash(tmp: str) -> None:
        Path(tmp).write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, crash)
    assert json.loads(target.read_text()) == {"state": "running"}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
