"""Preflight: refuse a launch that is doomed before anything is submitted (exit 2).

Data: every token file the runs read exists, is readable and non-empty, holds a whole
number of items of its dtype and at least one window (seq_len + 1), and its largest token
id is below the model's vocab_size. The id check samples evenly spaced chunks of a file
(first and last included) and is cached per file by size and mtime, so a relaunch of a
10,000-run sweep over the same corpus does not read it again.

Modules: every ``precision.keep_bf16`` glob matches a module of the run's network.

Cluster (SLURM): the partition exists (one ``sinfo`` call) and the account and QOS are
ones the user is associated with (one ``sacctmgr`` call); each run's resources fit one
node of the partition and its time limit fits the partition's.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from models.config import RunSpec, TextFileData, TokenFileData
from runfolder.atomic import atomic_write_json, read_json
from sweep.errors import GridError

if TYPE_CHECKING:
    from sweep.executors.base import BaseExecutor
    from sweep.grid import LaunchSettings

SAMPLE_CHUNKS = 64
CHUNK_TOKENS = 1 << 16
ITEMSIZE = {"uint16": 2, "uint32": 4}


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mxscale" / "token-files.json"


def check_data(source: str, specs: list[RunSpec]) -> None:
    """Refuse runs whose token or text files cannot be trained on."""
    cache = read_json(cache_path()) or {}
    changed = False
    seen: set[tuple[str, str, int, int]] = set()
    for spec in specs:
        data = spec.data
        if not isinstance(data, TokenFileData | TextFileData):
            continue
        dtype = data.dtype if isinstance(data, TokenFileData) else "uint8"
        for path in (*data.train, *data.validation):
            key = (path, dtype, spec.model.vocab_size, spec.model.seq_len)
            if key in seen:
                continue
            seen.add(key)
            max_id, fresh = _max_token_id(source, path, dtype, spec.model.seq_len + 1, cache)
            changed |= fresh
            if isinstance(data, TokenFileData) and max_id >= spec.model.vocab_size:
                raise GridError(
                    f"{source}: data file {path}: token id {max_id} >= model.vocab_size="
                    f"{spec.model.vocab_size} (run {spec.run_id}); wrong tokenizer or "
                    "vocab_size"
                )
    if changed:
        _write_cache(cache)


def _max_token_id(
    source: str, path: str, dtype: str, min_tokens: int, cache: dict
) -> tuple[int, bool]:
    """(largest sampled token id, whether it was computed now rather than cached)."""
    file = Path(path)
    where = f"{source}: data file {path}"
    try:
        stat = file.stat()
    except FileNotFoundError:
        raise GridError(f"{where}: does not exist (relative to {Path.cwd()})") from None
    except OSError as err:
        raise GridError(f"{where}: cannot be read: {err}") from None
    if not file.is_file():
        raise GridError(f"{where}: not a regular file")
    itemsize = ITEMSIZE.get(dtype, 1)
    if stat.st_size == 0:
        raise GridError(f"{where}: is empty")
    if stat.st_size % itemsize:
        raise GridError(
            f"{where}: {stat.st_size} bytes is not a multiple of {itemsize} ({dtype}); "
            "corrupt, or data.dtype is wrong"
        )
    if stat.st_size // itemsize < min_tokens:
        raise GridError(
            f"{where}: holds {stat.st_size // itemsize} tokens; at least {min_tokens} "
            "(seq_len + 1) are needed"
        )
    key = f"{file.resolve()}|{dtype}"
    entry = cache.get(key)
    if entry and entry["size"] == stat.st_size and entry["mtime_ns"] == stat.st_mtime_ns:
        return int(entry["max_id"]), False
    try:
        max_id = sample_max_id(file, dtype, stat.st_size // itemsize)
    except OSError as err:
        raise GridError(f"{where}: cannot be read: {err}") from None
    cache[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "max_id": max_id}
    return max_id, True


def sample_max_id(file: Path, dtype: str, n_tokens: int) -> int:
    """Largest id in SAMPLE_CHUNKS evenly spaced chunks (the whole file when small)."""
    import numpy as np

    tokens = np.memmap(file, dtype=dtype, mode="r", shape=(n_tokens,))
    if n_tokens <= SAMPLE_CHUNKS * CHUNK_TOKENS:
        return int(tokens.max())
    starts = np.linspace(0, n_tokens - CHUNK_TOKENS, SAMPLE_CHUNKS).astype(np.int64)
    return max(int(tokens[s : s + CHUNK_TOKENS].max()) for s in starts)


def _write_cache(cache: dict) -> None:
    # A read-only home only costs the next launch a re-check.
    with contextlib.suppress(OSError):
        atomic_write_json(cache_path(), cache)


def check_modules(source: str, specs: list[RunSpec]) -> None:
    """Refuse ``precision.keep_bf16`` globs that match no module of the run's network (built
    on the meta device once per model shape and glob list)."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for spec in specs:
        key = (spec.model.model_dump_json(), spec.precision.keep_bf16)
        if not spec.precision.keep_bf16 or key in seen:
            continue
        seen.add(key)
        from models.precheck import unmatched_keep_bf16

        globs, names = unmatched_keep_bf16(spec)
        if globs:
            # Shallow names first: the top-level modules (embed, head) tell the most.
            shallow = sorted(names, key=lambda name: name.count("."))
            shown = ", ".join(shallow[:10]) + (" ..." if len(names) > 10 else "")
            raise GridError(
                f"{source}: precision.keep_bf16: glob {globs[0]!r} matches no module of run "
                f"{spec.run_id} ({spec.precision.label}); module names look like: {shown} "
                "(a negative index counts from the end: blocks.-1)"
            )


# -- cluster ---------------------------------------------------------------------------------


@dataclass
class Partition:
    """What sinfo says about one partition (the smallest node of it)."""

    name: str
    time_limit_min: float | None  # None: unlimited
    cpus: int
    mem_mb: int
    gpus: int


def parse_time_limit(text: str) -> float | None:
    """SLURM's [days-]hours:minutes:seconds (or minutes, or UNLIMITED) in minutes."""
    text = text.strip()
    if text.lower() in ("infinite", "unlimited", "n/a", ""):
        return None
    days, _, rest = text.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    if len(parts) == 1:
        minutes = parts[0]
    else:
        while len(parts) < 3:
            parts.insert(0, 0.0)
        hours, mins, secs = parts
        minutes = hours * 60 + mins + secs / 60
    return minutes + (float(days) * 1440 if days else 0.0)


def parse_gpus(gres: str) -> int:
    """GPUs per node from a GRES string such as ``gpu:a100:4(S:0-1),shard:8``."""
    total = 0
    for item in gres.split(","):
        match = re.match(r"gpu(?::[^:(]+)?:(\d+)", item.strip())
        if match:
            total += int(match.group(1))
    return total


def parse_sinfo(text: str) -> dict[str, Partition]:
    """``sinfo -h -o '%P|%l|%c|%m|%G'`` lines: one per node group; a partition keeps its
    smallest node (a run must fit wherever it lands)."""
    partitions: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 5 or not fields[0]:
            continue
        name = fields[0].rstrip("*")
        cpus = int(re.sub(r"\D", "", fields[2]) or 0)
        mem = int(re.sub(r"\D.*", "", fields[3]) or 0)
        found = Partition(name, parse_time_limit(fields[1]), cpus, mem, parse_gpus(fields[4]))
        known = partitions.get(name)
        if known is None:
            partitions[name] = found
        else:
            known.cpus, known.mem_mb = min(known.cpus, cpus), min(known.mem_mb, mem)
            known.gpus = min(known.gpus, found.gpus)
    return partitions


def parse_associations(text: str) -> tuple[set[str], set[str]]:
    """``sacctmgr -n -P show assoc user=U format=Account,QOS`` lines: accounts, QOS names."""
    accounts: set[str] = set()
    qos: set[str] = set()
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 2 or not fields[0]:
            continue
        accounts.add(fields[0])
        qos.update(q for q in fields[1].split(",") if q)
    return accounts, qos


def default_partition(text: str) -> str | None:
    for line in text.splitlines():
        name = line.split("|", 1)[0].strip()
        if name.endswith("*"):
            return name[:-1]
    return None


def check_cluster(
    source: str,
    specs: list[RunSpec],
    partition: str | None,
    account: str | None,
    qos: str | None,
) -> None:
    """Refuse a SLURM launch the cluster would reject or never start."""
    sinfo = _query(["sinfo", "-h", "-o", "%P|%l|%c|%m|%G"])
    if sinfo is None:
        return  # no sinfo: the executor's own check reports the missing SLURM
    partitions = parse_sinfo(sinfo)
    name = partition or default_partition(sinfo)
    if partition and partition not in partitions:
        raise GridError(
            f"{source}: launch.partition {partition!r} does not exist; partitions: "
            f"{', '.join(sorted(partitions))}"
        )
    if account or qos:
        user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
        assoc = _query(
            ["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=Account,QOS"]
        )
        if assoc is not None:
            accounts, qos_names = parse_associations(assoc)
            if account and accounts and account not in accounts:
                raise GridError(
                    f"{source}: launch.account {account!r} is not one of yours: "
                    f"{', '.join(sorted(accounts))}"
                )
            if qos and qos_names and qos not in qos_names:
                raise GridError(
                    f"{source}: launch.qos {qos!r} is not one you may use: "
                    f"{', '.join(sorted(qos_names))}"
                )
    if name in partitions:
        check_fit(source, specs, partitions[name])


def check_fit(source: str, specs: list[RunSpec], part: Partition) -> None:
    """Each run's per-node resources and time limit against the partition's."""
    for spec in specs:
        res = spec.resources
        cpus = res.cpus * res.tasks_per_node
        problems = []
        if part.cpus and cpus > part.cpus:
            problems.append(f"{cpus} CPUs per node (cpus x tasks_per_node) > {part.cpus}")
        if res.gpus > part.gpus:
            problems.append(f"resources.gpus={res.gpus} per node > {part.gpus}")
        if res.mem_gb and part.mem_mb and res.mem_gb * 1024 > part.mem_mb:
            problems.append(f"resources.mem_gb={res.mem_gb:g} > {part.mem_mb / 1024:.0f} GB")
        if part.time_limit_min is not None and res.time_min > part.time_limit_min:
            problems.append(
                f"resources.time_min={res.time_min} > the partition's {part.time_limit_min:g} min"
            )
        if problems:
            raise GridError(
                f"{source}: run {spec.run_id} does not fit partition {part.name!r}: "
                + "; ".join(problems)
            )


def _query(argv: list[str]) -> str | None:
    if not shutil.which(argv[0]):
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def preflight(
    source: str,
    specs: list[RunSpec],
    executor: type[BaseExecutor],
    settings: LaunchSettings,
) -> None:
    """Every check that applies to this launch; raises GridError (exit 2) on the first."""
    check_data(source, specs)
    check_modules(source, specs)
    executor.check_cluster(source, specs, settings)
