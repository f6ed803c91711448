"""Batched durable writes: nothing visible before commit, two filesystem syncs per batch
(not one fsync per file), a killed writer leaves no partial file under a real name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runfolder import durable
from runfolder.durable import DurableBatch
from runfolder.records import Submission
from sweep.durable import record_submissions, write_specs
from sweep.store import SweepStore


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"fsync": 0, "syncfs": 0}
    real_fsync, real_syncfs = os.fsync, durable.syncfs

    def fsync(fd: int) -> None:
        calls["fsync"] += 1
        real_fsync(fd)

    def syncfs(path: Path) -> bool:
        calls["syncfs"] += 1
        return real_syncfs(path)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(durable, "syncfs", syncfs)
    return calls


def test_staged_files_appear_whole_at_commit_with_two_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    calls = _counting(monkeypatch)
    batch = DurableBatch()
    paths = [tmp_path / f"run{i}" / "spec.json" for i in range(200)]
    for i, path in enumerate(paths):
        batch.write_json(path, {"i": i})
    assert len(batch) == 200
    assert not any(path.exists() for path in paths), "visible before commit"
    batch.commit()
    assert [json.loads(p.read_text())["i"] for p in paths] == list(range(200))
    assert calls == {"fsync": 0, "syncfs": 2}
    # No temp file is left beside any target, and the mode is a plain open()'s.
    assert sorted(p.name for p in paths[0].parent.iterdir()) == ["spec.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert paths[0].stat().st_mode & 0o777 == 0o666 & ~umask


def test_without_syncfs_every_file_and_folder_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    calls = _counting(monkeypatch)
    monkeypatch.setattr(durable, "syncfs", lambda path: False)
    batch = DurableBatch()
    for i in range(5):
        batch.write_text(tmp_path / f"d{i % 2}" / f"f{i}", "x")
    batch.commit()
    assert calls["fsync"] == 5 + 2  # the files, then their two folders
    assert sorted(p.name for p in tmp_path.rglob("f*")) == [f"f{i}" for i in range(5)]


def test_a_writer_killed_before_commit_leaves_no_file_under_its_name(tmp_path: Path):
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from runfolder.durable import DurableBatch\n"
        "b = DurableBatch()\n"
        "for i in range(50):\n"
        "    b.write_text(Path(sys.argv[1]) / f'r{i}' / 'spec.json', 'x' * 1000)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True)
    assert proc.returncode == -9
    assert not list(tmp_path.rglob("spec.json"))
    assert len(list(tmp_path.rglob(".spec.json.*.tmp"))) == 50  # hidden temp files only


def test_specs_kept_and_submissions_recorded_in_batches(tmp_path: Path):
    store = SweepStore(tmp_path / "sweep")
    write_specs(store, [("a", '{"v": 1}'), ("b", '{"v": 1}')])
    write_specs(store, [("a", '{"v": 2}'), ("c", '{"v": 2}')])  # a readable spec stays
    assert [json.loads((store.runs_dir / r / "spec.json").read_text())["v"] for r in "abc"] == [
        1,
        1,
        2,
    ]
    record_submissions(store, [Submission("a", "local", None, 2, token="t")])
    record = store.record("a", 0.0)
    assert (record.attempt, record.submitted["token"], record.submitted["pid"]) == (
        2,
        "t",
        os.getpid(),
    )
