"""How many jobs SLURM lets this launch queue, waves under that limit, and sbatch retries.

A cluster caps a launch three ways: MaxArraySize (task ids of one array) and MaxJobCount
(job records of the whole controller) from ``scontrol show config``, and MaxSubmitJobs
of the user's association (``sacctmgr show assoc``) or of the job's QOS, per user or per
account (``sacctmgr show qos``: MaxSubmitPU, MaxSubmitPA). Each array task counts as one
job. The limits are read once per launch; the jobs already queued (the user's, the
account's, everyone's) are counted with one ``squeue`` before each chunk. When the queue
is full the launcher waits, saying so, until earlier jobs end (``wait_for_room``).

sbatch answers "Socket timed out on send/recv operation" or "Unable to contact slurm
controller" when the controller is overloaded: ``submit_chunk`` retries the chunk a
bounded number of times with exponential backoff. A timed-out sbatch may still have
queued its array, so each try has its own write-ahead token: the jobs carrying the old one
are looked up and cancelled (or, if the controller cannot say, left to the next launch's
``resolve_open``); a job of an old token never trains, as its task's guard finds another
token in submitted.json.
"""

from __future__ import annotations

import getpass
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sweep import faults
from sweep.errors import SweepError

if TYPE_CHECKING:
    from sweep.journal import Journal

# slurm_strerror() texts of the transient errors; anything else sbatch says is final.
RETRYABLE_SBATCH_ERRORS = (
    "Socket timed out on send/recv operation",
    "Unable to contact slurm controller",
)
SBATCH_TRIES = 5
BACKOFF_FIRST_S = 2.0
BACKOFF_MAX_S = 60.0
# How often a full queue is looked at again while waiting for room.
WAIT_POLL_S = 10.0
_TIMEOUT_S = 60

T = TypeVar("T")
Report = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Limit:
    """One MaxSubmitJobs-like cap and what it counts: jobs of ``user``, ``account`` and/or
    ``qos`` (None: any), or every job of the controller."""

    name: str  # for messages: "MaxSubmitJobs of association root/root"
    value: int
    user: str | None = None
    account: str | None = None
    qos: str | None = None

    def used(self, queue: Sequence[tuple[str, str, str]]) -> int:
        """Jobs of ``queue`` ((user, account, qos) per task) this limit counts."""
        return sum(
            (self.user is None or user == self.user)
            and (self.account is None or account == self.account)
            and (self.qos is None or qos == self.qos)
            for user, account, qos in queue
        )


@dataclass(frozen=True)
class SubmitLimits:
    """The cluster's caps on one launch's submissions."""

    max_array_size: int
    limits: tuple[Limit, ...] = ()

    def room(self, queue: Sequence[tuple[str, str, str]]) -> tuple[int, Limit | None]:
        """Jobs that may still be queued, and the limit that binds (None: only the array
        size does)."""
        tightest: tuple[int, Limit | None] = (sys.maxsize, None)
        for limit in self.limits:
            left = max(0, limit.value - limit.used(queue))
            if left < tightest[0]:
                tightest = (left, limit)
        return tightest


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except (FileNotFoundError, subprocess.TimeoutExpired) as err:
        return subprocess.CompletedProcess(argv, 127, "", str(err))


def _config_value(text: str, key: str) -> int | None:
    match = re.search(rf"^{key}\s*=\s*(\d+)", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _int_or_none(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def read_submit_limits(account: str | None = None, qos: str | None = None) -> SubmitLimits:
    """MaxArraySize, MaxJobCount and the MaxSubmitJobs that apply to this user (one
    ``scontrol`` and two ``sacctmgr`` calls). Without accounting only the first two apply."""
    from sweep.executors.slurm import SlurmUnavailableError

    config = _run(["scontrol", "show", "config"])
    if config.returncode != 0:
        raise SlurmUnavailableError(f"`scontrol show config` failed: {config.stderr.strip()}")
    max_array = _config_value(config.stdout, "MaxArraySize")
    if max_array is None:
        raise SlurmUnavailableError("`scontrol show config` has no MaxArraySize line")
    limits: list[Limit] = []
    max_jobs = _config_value(config.stdout, "MaxJobCount")
    if max_jobs:
        limits.append(Limit("MaxJobCount of the controller", max_jobs))
    user = getpass.getuser()
    assoc = _run(
        ["sacctmgr", "-n", "-P", "show", "assoc", "where", f"user={user}"]
        + ["format=Account,Partition,MaxSubmit,DefaultQOS"]
    )
    default_qos = None
    if assoc.returncode == 0:
        rows = [line.split("|") for line in assoc.stdout.splitlines() if line.count("|") == 3]
        # The account asked for, else the user's associations (the default account first).
        mine = [row for row in rows if account is None or row[0] == account]
        for acct, partition, max_submit, row_qos in mine:
            default_qos = default_qos or row_qos or None
            value = _int_or_none(max_submit)
            if value is not None:
                where = f"{acct}/{user}" + (f"/{partition}" if partition else "")
                limits.append(Limit(f"MaxSubmitJobs of association {where}", value, user, acct))
    job_qos = qos or default_qos or "normal"
    qos_rows = _run(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxSubmitPU,MaxSubmitPA"])
    if qos_rows.returncode == 0:
        for line in qos_rows.stdout.splitlines():
            name, _, rest = line.partition("|")
            if name != job_qos:
                continue
            per_user, _, per_account = rest.partition("|")
            if (value := _int_or_none(per_user)) is not None:
                limits.append(Limit(f"MaxSubmitPU of QOS {name}", value, user, None, name))
            if (value := _int_or_none(per_account)) is not None and account:
                limits.append(Limit(f"MaxSubmitPA of QOS {name}", value, None, account, name))
    return SubmitLimits(max_array, tuple(limits))


def queued_jobs() -> list[tuple[str, str, str]] | None:
    """(user, account, qos) of every job task the controller holds (one ``squeue``, array
    tasks expanded); None when it does not answer."""
    result = _run(["squeue", "-h", "-r", "-o", "%u|%a|%q"])
    if result.returncode != 0:
        return None
    jobs = []
    for line in result.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            jobs.append((parts[0], parts[1], parts[2]))
    return jobs


def wait_for_room(
    limits: SubmitLimits,
    left: int,
    report: Report = _stderr,
    poll_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Block until at least one more job may be queued; return how many may. ``left``: runs
    still to submit (for the message). A silent controller counts as no room yet."""
    waiting_since = None
    while True:
        queue = queued_jobs()
        room, binding = limits.room(queue) if queue is not None else (0, None)
        if room > 0:
            if waiting_since is not None:
                report(f"queue has room for {room} job(s) again: submitting")
            return room
        if waiting_since is None:
            waiting_since = time.monotonic()
            why = (
                f"{binding.name} = {binding.value} reached"
                if binding is not None
                else "squeue does not answer"
            )
            report(
                f"waiting: {why}; {left} run(s) left to submit, the next chunk goes when "
                "earlier jobs end (Ctrl-C stops waiting: a later `sweep launch` submits "
                "the rest)"
            )
        sleep(WAIT_POLL_S if poll_s is None else poll_s)


def waves(
    groups: Sequence[tuple[Any, list[T]]],
    limits: SubmitLimits,
    report: Report = _stderr,
    poll_s: float | None = None,
) -> Iterator[tuple[Any, list[T], int]]:
    """(group key, chunk, estimated chunk count) per chunk to submit, in order: chunks stay
    below MaxArraySize and fit the room the other caps leave (counted before each chunk,
    waiting while there is none). Consume lazily: the room is counted when asked."""
    array_cap = limits.max_array_size - 1
    if array_cap < 1:
        raise ValueError(f"max_array_size must be >= 2, got {limits.max_array_size}")
    total = sum(len(items) for _, items in groups)
    done, emitted = 0, 0
    for position, (key, items) in enumerate(groups):
        start = 0
        while start < len(items):
            room = wait_for_room(limits, total - done, report, poll_s) if limits.limits else total
            size = min(array_cap, room, len(items) - start)
            chunk = items[start : start + size]
            start += size
            done += size
            emitted += 1
            # Chunks so far, plus those of the full array size still to come.
            later = -(-(len(items) - start) // array_cap)
            later += sum(-(-len(rest) // array_cap) for _, rest in groups[position + 1 :])
            yield key, chunk, emitted + later


class SbatchGaveUpError(SweepError):
    """sbatch kept failing with a transient error for every try."""


def is_retryable(error: BaseException) -> bool:
    """True for an sbatch failure that says the controller was busy or unreachable."""
    return any(message in str(error) for message in RETRYABLE_SBATCH_ERRORS)


def backoff_s(try_number: int) -> float:
    """Seconds to wait after failed try ``try_number`` (1-based): 2, 4, 8, ... up to 60."""
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (try_number - 1))


def submit_chunk(
    journal: Journal | None,
    runs: list[tuple[str, int]],
    index: int,
    chunks: int,
    sbatch: Callable[[str], T],
    sweep_dir: os.PathLike,
    *,
    tries: int = SBATCH_TRIES,
    report: Report = _stderr,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, T]:
    """Submit one chunk through ``sbatch(token)`` under a fresh write-ahead intent per try;
    return (token, what sbatch returned). A transient error is retried ``tries`` times in
    all with exponential backoff, the jobs of the failed try cancelled first; any other
    error (or the last transient one) marks the intent failed and propagates."""
    from sweep.journal import new_token, remove_stray_files

    for attempt in range(1, tries + 1):
        token = journal.open(runs, index, chunks) if journal else new_token()
        try:
            return token, sbatch(token)
        except Exception as err:
            if not is_retryable(err):
                if journal:
                    journal.failed(token, err)
                raise
            settled = _cancel_token_jobs(journal, token, err)
            # submitit's pickles and batch script of the failed try (only ours: we hold
            # the sweep lock).
            remove_stray_files(sweep_dir, [])
            if attempt == tries:
                raise SbatchGaveUpError(
                    f"sbatch of chunk {index} failed {tries} times ({_first_line(err)}); "
                    "its runs stay pending: launch again once the controller answers"
                ) from err
            delay = backoff_s(attempt)
            report(
                f"sbatch of chunk {index} failed ({_first_line(err)}); try {attempt + 1} of "
                f"{tries} in {delay:g} s"
                + ("" if settled else " (its jobs, if any, are cancelled by the next launch)")
            )
            faults.passed("sbatch-retry")
            sleep(delay)
    raise AssertionError("unreachable")  # the last try returns or raises


def _cancel_token_jobs(journal: Journal | None, token: str, error: BaseException) -> bool:
    """Cancel the jobs a timed-out sbatch may have queued under ``token`` and record it;
    False when squeue does not answer (the intent stays open for ``resolve_open``)."""
    from sweep.executors.slurm import cancel_jobs, jobs_by_comment
    from sweep.journal import COMMENT_PREFIX

    alive = jobs_by_comment(COMMENT_PREFIX + token)
    if alive is None:
        return False
    jobs = alive.get(COMMENT_PREFIX + token, [])
    cancel_jobs(jobs)
    if journal:
        journal.cancelled(token, jobs, error)
    return True


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[-1] if text else type(error).__name__
