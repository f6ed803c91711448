"""Atomic file writes and the one tolerant JSON reader of the run folder.

A reader sees the old file or the new one, never a partial one; a file a killed writer left
missing or cut short reads as absent.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a dot-prefixed temp file beside ``path``, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    # mkstemp creates 0600; give the file the mode a plain open() would (others may read it).
    os.chmod(tmp, 0o666 & ~_UMASK)
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def atomic_write_json(path: str | os.PathLike, payload: Any) -> Path:
    """Write ``payload`` as indented JSON to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike) -> dict | None:
    """A JSON object file's content, or None if it is missing, unreadable, cut short or not
    an object (a killed writer on a filesystem without atomic rename, outside damage)."""
    try:
        payload = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return payload if isinstance(payload, dict) else None
