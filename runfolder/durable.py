"""Many small files made durable with one sync for all, not one fsync each.

A launch of 10,000 runs writes 10,000 spec.json and 10,000 submitted.json; an fsync per
file made it wait on the disk 20,000 times. ``DurableBatch`` keeps the guarantees of
``runfolder.atomic`` (a reader sees the old file or the new one, and a file that is visible
is on disk) with two syncs per batch:

1. each file is written to a dot-prefixed temp file beside its target (unseen by readers);
2. one ``syncfs`` of the filesystem makes every temp file durable (``fsync`` per file where
   syncfs is missing);
3. the temp files are renamed onto their targets;
4. a second ``syncfs`` (else an fsync per folder) makes the renames durable.

A crash before step 3 leaves only temp files; one during step 3 leaves some targets
renamed, each whole and durable. Whoever records that the files exist (the launcher's
submission journal) does so only after ``commit`` returns.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path
from typing import Any

from runfolder.atomic import FILE_MODE, json_text

_LIBC = ctypes.CDLL(None, use_errno=True)


def syncfs(path: Path) -> bool:
    """Flush the filesystem holding ``path``; False where the call is not available."""
    call = getattr(_LIBC, "syncfs", None)
    if call is None:
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        return call(fd) == 0
    finally:
        os.close(fd)


class DurableBatch:
    """Stage file writes, then ``commit`` them all at once (see the module docstring)."""

    def __init__(self) -> None:
        self._staged: list[tuple[str, Path]] = []

    def __len__(self) -> int:
        return len(self._staged)

    def write_text(self, path: Path, text: str) -> None:
        """Stage ``text`` for ``path`` (its folder is created now)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, FILE_MODE)
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        self._staged.append((tmp, path))

    def write_json(self, path: Path, payload: Any) -> None:
        """Stage ``payload`` as JSON, as ``runfolder.atomic.atomic_write_json`` writes it."""
        self.write_text(path, json_text(payload))

    def commit(self) -> None:
        """Make every staged file durable, then visible under its name, then the names
        durable; the batch is empty afterwards."""
        staged, self._staged = self._staged, []
        if not staged:
            return
        root = staged[0][1].parent
        try:
            if not syncfs(root):
                for tmp, _ in staged:
                    _fsync_path(tmp)
        except BaseException:
            for tmp, _ in staged:
                Path(tmp).unlink(missing_ok=True)
            raise
        for tmp, path in staged:
            os.replace(tmp, path)
        if not syncfs(root):
            for folder in {path.parent for _, path in staged}:
                _fsync_path(folder)

    def discard(self) -> None:
        """Remove the staged temp files (nothing was committed)."""
        for tmp, _ in self._staged:
            Path(tmp).unlink(missing_ok=True)
        self._staged = []


def _fsync_path(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
