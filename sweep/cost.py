"""Cost and ETA of a sweep from measured throughput (`sweep status`, `sweep plan
--calibrate-from`).

Throughput is measured per run: a finished run's summary (tokens/s over its training
wall time), a running run's marker (steps since its first logged step over the time
since). It is compared across runs as FLOP/s per device (C = 6·N·D per second divided by
the run's GPUs, or cores on CPU), so a measured small run prices a larger one of the same
config. A run not measured yet takes the median of runs like it (same config and shape,
else same config, else any run), and the assumed rate of `sweep plan` when none ran.

The ETA assumes the sweep keeps its current concurrency (the runs running now): the
longest remaining running run, or the remaining run time spread over that many slots.

Import-light (fast `sweep status` path): models.flops is plain arithmetic.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from models.flops import lm_param_count, proxy_param_count
from sweep.store import RunRecord

ASSUMED_GPU_FLOPS = 150e12
ASSUMED_CORE_FLOPS = 10e9
FINISHED = ("done", "diverged", "failed", "cancelled")


def n_params(spec: dict[str, Any]) -> int:
    """Parameter count from a resolved spec.json (every field present)."""
    model = spec["model"]
    if model.get("kind", "lm") == "proxy":
        return proxy_param_count(
            model["width"],
            model["depth"],
            mlp_ratio=model["mlp_ratio"],
            swiglu=model["activation"] == "swiglu",
            layernorm=model["layernorm"],
        )
    return lm_param_count(
        model["d_model"],
        model["n_layers"],
        model["vocab_size"],
        mlp_ratio=model["mlp_ratio"],
        tie_embeddings=model["tie_embeddings"],
        swiglu=model["mlp"] == "swiglu",
    )


def priceable(spec: dict[str, Any]) -> bool:
    """Whether the spec has what pricing needs (a hand-made or partial spec may not)."""
    try:
        n_params(spec), tokens_per_step(spec), devices(spec)
    except (KeyError, TypeError, ValueError):
        return False
    return True


def tokens_per_step(spec: dict[str, Any]) -> int:
    model = spec["model"]
    per_sample = 1 if model.get("kind", "lm") == "proxy" else model["seq_len"]
    return int(spec["train"]["batch_size"]) * per_sample


def devices(spec: dict[str, Any]) -> tuple[str, int]:
    """("gpu", GPUs) or ("core", CPU cores) the run occupies."""
    res = spec.get("resources", {})
    nodes = int(res.get("nodes", 1))
    if res.get("gpus"):
        return "gpu", int(res["gpus"]) * nodes
    return "core", int(res.get("cpus", 1)) * int(res.get("tasks_per_node") or 1) * nodes


def measured_tokens_per_s(record: RunRecord) -> float | None:
    """A run's own measured throughput, if it has one."""
    summary = record.summary or {}
    if summary.get("tokens_per_s"):
        return float(summary["tokens_per_s"])
    marker = record.marker or {}
    first, first_at = marker.get("first_step"), marker.get("first_step_at")
    if record.state in ("running", "hung") and first is not None and first_at:
        seconds = float(marker.get("heartbeat", 0.0)) - float(first_at)
        steps = int(marker.get("step", 0)) - int(first)
        if steps > 0 and seconds > 0:
            return steps * tokens_per_step(record.spec) / seconds
    return None


def shape_key(spec: dict[str, Any]) -> tuple:
    model = spec["model"]
    return (
        spec.get("tags", {}).get("config"),
        model.get("kind", "lm"),
        model.get("d_model") or model.get("width"),
        model.get("n_layers") or model.get("depth"),
    )


@dataclass
class Estimate:
    """One group's (a config's, or the sweep's) cost so far and still to come."""

    runs: int = 0
    finished: int = 0
    running: int = 0
    elapsed_hours: dict[str, float] = field(default_factory=lambda: {"gpu": 0.0, "core": 0.0})
    remaining_hours: dict[str, float] = field(default_factory=lambda: {"gpu": 0.0, "core": 0.0})
    remaining_run_s: list[float] = field(default_factory=list)
    running_remaining_s: list[float] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def eta_s(self) -> float | None:
        """Seconds to the end at the current concurrency (None: nothing runs, work left)."""
        if not self.remaining_run_s:
            return 0.0
        if not self.running:
            return None
        spread = sum(self.remaining_run_s) / self.running
        return max(max(self.running_remaining_s, default=0.0), spread)

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "finished": self.finished,
            "running": self.running,
            "elapsed_gpu_hours": self.elapsed_hours["gpu"],
            "elapsed_core_hours": self.elapsed_hours["core"],
            "remaining_gpu_hours": self.remaining_hours["gpu"],
            "remaining_core_hours": self.remaining_hours["core"],
            "eta_s": self.eta_s(),
            "estimated_from": dict(self.sources),
        }


def flop_rate_per_device(record: RunRecord) -> float | None:
    """A run's measured FLOP/s per device (6·N·tokens/s / devices)."""
    rate = measured_tokens_per_s(record)
    if rate is None:
        return None
    return 6.0 * n_params(record.spec) * rate / devices(record.spec)[1]


class RateBook:
    """Measured FLOP/s per device, looked up by similarity (shape, config, any)."""

    def __init__(self, records: Iterable[RunRecord]):
        self.by_shape: dict[tuple, list[float]] = defaultdict(list)
        self.by_config: dict[Any, list[float]] = defaultdict(list)
        self.by_kind: dict[str, list[float]] = defaultdict(list)
        for record in records:
            if not priceable(record.spec):
                continue
            rate = flop_rate_per_device(record)
            if rate:
                key = shape_key(record.spec)
                self.by_shape[key].append(rate)
                self.by_config[key[0]].append(rate)
                self.by_kind[devices(record.spec)[0]].append(rate)

    def rate(self, spec: dict[str, Any]) -> tuple[float, str]:
        """(FLOP/s per device, where it came from) for a run not measured itself."""
        key = shape_key(spec)
        kind = devices(spec)[0]
        for source, rates in (
            ("similar runs", self.by_shape.get(key)),
            ("same config", self.by_config.get(key[0])),
            ("any run", self.by_kind.get(kind)),
        ):
            if rates:
                return statistics.median(rates), source
        return (ASSUMED_GPU_FLOPS if kind == "gpu" else ASSUMED_CORE_FLOPS), "assumed"


def estimate(records: list[RunRecord], now: float) -> tuple[dict[str, Estimate], Estimate]:
    """Per-config and whole-sweep cost and ETA."""
    book = RateBook(records)
    per_config: dict[str, Estimate] = defaultdict(Estimate)
    total = Estimate()
    for record in records:
        spec = record.spec
        if not priceable(spec):
            continue  # a run folder without (a whole) spec yet: nothing to price
        kind, count = devices(spec)
        for group in (per_config[record.config], total):
            group.runs += 1
        elapsed_s = _elapsed_s(record, now)
        remaining_s = 0.0
        if record.state not in FINISHED:
            own = flop_rate_per_device(record)
            rate, source = (own, "measured") if own else book.rate(spec)
            steps_left = max(0, record.total_steps - record.step)
            flops_left = 6.0 * n_params(spec) * steps_left * tokens_per_step(spec)
            remaining_s = flops_left / (rate * count)
        for group in (per_config[record.config], total):
            group.elapsed_hours[kind] += elapsed_s * count / 3600
            if record.state in FINISHED:
                group.finished += 1
                continue
            group.sources[source] += 1
            group.remaining_hours[kind] += remaining_s * count / 3600
            group.remaining_run_s.append(remaining_s)
            if record.state == "running":
                group.running += 1
                group.running_remaining_s.append(remaining_s)
    return dict(sorted(per_config.items())), total


def _elapsed_s(record: RunRecord, now: float) -> float:
    summary = record.summary or {}
    if summary.get("wall_time_s") is not None:
        return float(summary["wall_time_s"])
    marker = record.marker or {}
    if record.state in ("running", "hung") and marker.get("started_at"):
        return max(0.0, now - float(marker["started_at"]))
    return 0.0


def worth_showing(records: list[RunRecord]) -> bool:
    """A cost table says something once a run is measured or the sweep is under way."""
    return any(
        priceable(r.spec) and (r.state in ("running", "queued", "hung") or measured_tokens_per_s(r))
        for r in records
    )


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "not running"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def calibrated_rates(records: list[RunRecord]) -> dict[str, tuple[float, int]]:
    """{"gpu"|"core": (median measured FLOP/s per device, runs measured)} of a sweep."""
    book = RateBook(records)
    return {kind: (statistics.median(rates), len(rates)) for kind, rates in book.by_kind.items()}
