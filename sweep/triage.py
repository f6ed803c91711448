"""Failure triage for `sweep status D --failures`, and the `hung` state.

Runs that failed, diverged, went stale or hung are grouped by cause so a thousand
failures read as a handful of rows: the exception type and message with run-specific
numbers, ids and paths masked; the scheduler's final state and exit code/signal (one
``sacct`` call for all SLURM runs); or the power-of-two step bucket of a divergence. Each
group keeps its count, a few example run ids and the last log lines of one example.

Kept import-light (no yaml/pydantic/rich): it runs on `sweep status`'s fast path.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sweep.executors.registry import known
from sweep.store import RunRecord, _process_alive

TRIAGED = ("failed", "diverged", "stale", "hung")
# No heartbeat for this long while the process (or job) lives: the run is hung.
HUNG_AFTER_S = 1800.0
EXAMPLES = 3
TAIL_LINES = 5

_MASKS = (
    (re.compile(r"(/[^\s:'\",()\[\]]+)+"), "<path>"),
    (re.compile(r"\b[0-9a-f]{12}\b"), "<id>"),
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>"),
    # Digits inside identifiers (fp8_e4m3, blocks.3) name things; they stay.
    (re.compile(r"(?<![A-Za-z_.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<n>"),
)


@dataclass
class FailureGroup:
    """Runs that ended the same way."""

    state: str
    cause: str
    count: int = 0
    run_ids: list[str] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)
    log_file: str | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "examples": self.run_ids[:EXAMPLES]}


def mask(message: str) -> str:
    """A message with what differs between runs (paths, run ids, numbers) masked."""
    for pattern, token in _MASKS:
        message = pattern.sub(token, message)
    return " ".join(message.split())


def mark_hung(records: Iterable[RunRecord], hung_after_s: float, now: float) -> None:
    """Call a running run ``hung`` when its process (or job) is alive but its heartbeat is
    older than ``hung_after_s`` (the heartbeat moves at every logged step)."""
    for record in records:
        marker = record.marker or {}
        if marker.get("state") != "running" or record.state not in ("running", "stale"):
            continue
        if now - float(marker.get("heartbeat", now)) <= hung_after_s:
            continue
        # The scheduler said running (record.state), or the run's process on this host
        # still exists (executors whose runs are processes here, or no submission known).
        executor = known((record.submitted or {}).get("executor"))
        local = executor is None or executor.tracks_pids
        here = marker.get("host") == socket.gethostname() and marker.get("pid")
        if record.state == "running" or (local and here and _process_alive(marker)):
            record.state = "hung"


def triage(records: list[RunRecord], scheduler: dict[str, tuple[str, str]] | None = None):
    """Group the failed/diverged/stale/hung runs by cause, largest group first.

    ``scheduler`` maps run ids to (final SLURM state, exit code) when known.
    """
    scheduler = scheduler if scheduler is not None else scheduler_outcomes(records)
    groups: dict[tuple[str, str], FailureGroup] = {}
    for record in records:
        if record.state not in TRIAGED:
            continue
        key = (record.state, cause_of(record, scheduler.get(record.run_id)))
        group = groups.setdefault(key, FailureGroup(*key))
        group.count += 1
        group.run_ids.append(record.run_id)
    ordered = sorted(groups.values(), key=lambda g: (-g.count, g.state, g.cause))
    by_id = {record.run_id: record for record in records}
    for group in ordered:
        path, tail = log_tail(by_id[group.run_ids[0]].run_dir)
        group.log_file, group.log_tail = (str(path) if path else None), tail
    return ordered


def cause_of(record: RunRecord, outcome: tuple[str, str] | None) -> str:
    """The cause a run's files (and the scheduler) give for how it ended."""
    marker = record.marker or {}
    if record.state == "diverged":
        step = (record.summary or {}).get("diverged_step") or marker.get("step") or 0
        return f"diverged at step {_bucket(int(step))}"
    if record.state == "hung":
        return f"no progress since step {marker.get('step', 0)} (process alive)"
    reason = marker.get("reason")
    if record.state == "failed" and marker.get("signal"):
        return str(reason)  # "killed by signal 9 (out of memory?)": the number is the cause
    # The run's own exception says more than the scheduler's FAILED / exit code 1.
    if record.state == "failed" and reason:
        return mask(str(reason))
    if outcome is not None:
        state, exit_code = outcome
        return f"scheduler {state}, exit {describe_exit(exit_code)}"
    if record.state == "stale":
        return "process gone without a final state (killed? out of memory?)"
    return f"{record.state} (no reason recorded)"


def describe_exit(exit_code: str) -> str:
    """sacct's "code:signal" as words: ``0:9`` is signal 9 (SIGKILL), ``1:0`` code 1."""
    code, _, sig = exit_code.partition(":")
    if sig and sig != "0":
        return f"signal {sig}"
    return f"code {code}" if code else "unknown"


def _bucket(step: int) -> str:
    if step < 1:
        return "0"
    low = 1 << (step.bit_length() - 1)
    return f"{low}-{2 * low - 1}"


def log_tail(run_dir: Path, lines: int = TAIL_LINES) -> tuple[Path | None, list[str]]:
    """The newest log file of a run and its last non-empty lines (read from the end)."""
    log_dir = run_dir / "logs"
    try:
        files = [entry for entry in os.scandir(log_dir) if entry.is_file()]
    except OSError:
        return None, []
    if not files:
        return None, []
    newest = Path(max(files, key=lambda entry: entry.stat().st_mtime_ns).path)
    with open(newest, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 16_384))
        text = handle.read().decode("utf-8", errors="replace")
    return newest, [line for line in text.splitlines() if line.strip()][-lines:]


def scheduler_outcomes(records: list[RunRecord]) -> dict[str, tuple[str, str]]:
    """Final scheduler state and exit code of the triaged runs, one call per executor that
    has a scheduler (SLURM: one ``sacct``); empty when there are none or it is not here."""
    by_executor: dict[str, list] = {}
    for record in records:
        if record.state in TRIAGED and record.submission is not None:
            by_executor.setdefault(record.submission.executor, []).append(record.submission)
    outcomes: dict[str, tuple[str, str]] = {}
    for name, submissions in by_executor.items():
        executor = known(name)
        if executor is not None:
            outcomes.update(executor.final_outcomes(submissions))
    return outcomes


def render_failures(groups: list[FailureGroup]) -> str:
    """One row per group (count, state, cause, examples), its example's log tail below."""
    if not groups:
        return "no failed, diverged, stale or hung runs"
    total = sum(group.count for group in groups)
    lines = [f"{total} run(s) in trouble, {len(groups)} cause(s)"]
    for group in groups:
        more = f" (+{group.count - EXAMPLES} more)" if group.count > EXAMPLES else ""
        lines.append(
            f"{group.count:>6}  {group.state:<8}  {group.cause}\n"
            f"        e.g. {', '.join(group.run_ids[:EXAMPLES])}{more}"
        )
        if group.log_tail:
            lines.append(f"        last lines of {group.log_file}:")
            lines.extend(f"          | {line[:200]}" for line in group.log_tail)
    return "\n".join(lines)
