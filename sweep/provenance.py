"""Which code produced a run: written into the run folder at the start of every attempt.

``provenance.json`` holds the git commit of the code tree, whether it was dirty (with the
hash of ``git diff HEAD``, the diff itself saved beside it as ``provenance-<hash>.diff``),
package versions, host, accelerator model, the command line and the attempt. Earlier
attempts' entries are kept under ``attempts``; the top level is the latest.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runfolder.atomic import atomic_write_json, atomic_write_text, read_json

PROVENANCE_FILE = "provenance.json"
PACKAGES = ("mxscale", "torch", "numpy", "pyarrow", "pydantic", "pandas", "submitit", "ray")
CODE_ROOT = Path(__file__).resolve().parents[1]


def git(*args: str, cwd: Path = CODE_ROOT) -> str | None:
    """Output of a git command in the code tree, or None (no git, not a checkout)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def accelerator() -> str | None:
    """The GPU model when torch sees one (torch is only asked if already imported, so the
    CLI never pays its import for this), else the CPU model."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu: " + (platform.processor() or platform.machine())


def collect(attempt: int, argv: list[str] | None = None) -> tuple[dict[str, Any], str | None]:
    """This process's provenance and the dirty diff (None when the tree is clean)."""
    commit = git("rev-parse", "HEAD")
    diff = git("diff", "HEAD", "--no-color") if commit else None
    record = {
        "attempt": attempt,
        "recorded_at": time.time(),
        "commit": commit.strip() if commit else None,
        "dirty": bool(diff),
        "diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
        "packages": package_versions(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "accelerator": accelerator(),
        "command": list(sys.argv if argv is None else argv),
    }
    return record, diff or None


def write_provenance(run_dir: Path, attempt: int) -> dict[str, Any]:
    """Record this attempt's provenance in ``run_dir`` (and its diff, when dirty)."""
    record, diff = collect(attempt)
    if diff:
        record["diff_file"] = f"provenance-{record['diff_sha256'][:12]}.diff"
        atomic_write_text(run_dir / record["diff_file"], diff)
    previous = read_json(run_dir / PROVENANCE_FILE) or {}
    history = [a for a in previous.get("attempts", []) if a.get("attempt") != attempt]
    atomic_write_json(run_dir / PROVENANCE_FILE, {**record, "attempts": [*history, record]})
    return record


def commits_of(run_dirs: list[Path]) -> dict[str, str | None]:
    """Run id -> commit of its latest attempt (None when unknown)."""
    out = {}
    for run_dir in run_dirs:
        record = read_json(run_dir / PROVENANCE_FILE) or {}
        out[run_dir.name] = record.get("commit")
    return out
