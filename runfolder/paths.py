"""Where each file of a run folder lives, and how its numbered files are named.

One run folder (``<sweep>/runs/<run_id>/``) holds:

- ``spec.json``       the run spec (the launcher writes it once)
- ``submitted.json``  the current submission: executor, job id, attempt, token
- ``state.json``      the run's own marker, heartbeat while running (only the run writes it)
- ``summary.json``    results of a finished run
- ``cancel.json``     a ``sweep cancel`` request (only cancel writes it)
- ``metrics/part-NNNNN.parquet``    step metrics, see runfolder.metrics
- ``checkpoints/step-NNNNNNNNN.pt`` training state at a step
- ``logs/attempt-<a>[.rank<r>].<stream>``  each attempt's output, whatever the executor
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SPEC_FILE = "spec.json"
SUBMITTED_FILE = "submitted.json"
STATE_FILE = "state.json"
SUMMARY_FILE = "summary.json"
CANCEL_FILE = "cancel.json"
METRICS_DIR = "metrics"
CHECKPOINTS_DIR = "checkpoints"
LOGS_DIR = "logs"

# Log streams: "log" is stdout and stderr in one file, "out"/"err" keep them apart.
LOG_STREAMS = ("log", "out", "err")
_CHECKPOINT = re.compile(r"step-(\d{9})\.pt")
_PART = re.compile(r"part-(\d{5})\.parquet")


@dataclass(frozen=True)
class RunPaths:
    """The paths of one run folder."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def spec(self) -> Path:
        return self.root / SPEC_FILE

    @property
    def submitted(self) -> Path:
        return self.root / SUBMITTED_FILE

    @property
    def state(self) -> Path:
        return self.root / STATE_FILE

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY_FILE

    @property
    def cancel(self) -> Path:
        return self.root / CANCEL_FILE

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_DIR

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def logs(self) -> Path:
        return self.root / LOGS_DIR

    def log(self, attempt: int, stream: str = "log", rank: int = 0) -> Path:
        """The log file of one attempt (and rank) of this run."""
        return self.logs / log_name(attempt, stream, rank)


def log_name(attempt: int, stream: str = "log", rank: int = 0) -> str:
    """``attempt-<a>.<stream>``; rank r > 0 of a multi-process run:
    ``attempt-<a>.rank<r>.<stream>``."""
    if stream not in LOG_STREAMS:
        raise ValueError(f"unknown log stream {stream!r}; allowed: {', '.join(LOG_STREAMS)}")
    rank_part = f".rank{rank}" if rank else ""
    return f"attempt-{attempt}{rank_part}.{stream}"


def attempt_logs(logs_dir: Path, attempt: int | None = None) -> list[Path]:
    """Log files in ``logs_dir``, oldest attempt first; only ``attempt``'s when given."""
    files = sorted(logs_dir.glob("attempt-*"), key=lambda p: (len(p.name), p.name))
    if attempt is None:
        return files
    return [p for p in files if p.name.split(".", 1)[0] == f"attempt-{attempt}"]


def checkpoint_path(ckpt_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return ckpt_dir / f"step-{step:09d}.pt"


def checkpoint_steps(ckpt_dir: Path) -> list[int]:
    """Steps of the checkpoints present, ascending (temp files are ignored)."""
    return _numbered(ckpt_dir, _CHECKPOINT)


def part_path(metrics_dir: Path, index: int) -> Path:
    """Path of metrics part number ``index``."""
    return metrics_dir / f"part-{index:05d}.parquet"


def part_indices(metrics_dir: Path) -> list[int]:
    """Indices of the metrics parts present, ascending (temp files are ignored)."""
    return _numbered(metrics_dir, _PART)


def visible(path: Path) -> bool:
    """False for the '.'/'_'-prefixed temp files writers leave until an atomic rename."""
    return not path.name.startswith((".", "_"))


def _numbered(folder: Path, pattern: re.Pattern[str]) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := pattern.fullmatch(p.name)))
