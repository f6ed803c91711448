"""The plots and tables ``sweep analyze`` and ``sweep report`` can make, registered by the
modules that define them (:func:`plot` / :func:`table` decorators).

Each item has a name (the ``--plot``/``--table`` value), a one-line description and its
:class:`Needs`: the run table (summaries), which step metrics (the loader reads only those
names and columns) and whether it needs a sweep folder (paired, branched and confound runs
exist only there, not in the paper's published data). The CLI help, ``all`` and the report's
pages are generated from here; a new figure is one decorated function in its own module plus
its module's name in :data:`MODULES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from analysis.report import Source

KINDS = ("plot", "table")
# Importing these registers the built-in items; they are listed in this order.
MODULES = (
    "analysis.figures",
    "analysis.tables",
    "analysis.paired",
    "analysis.interventions",
    "analysis.confound",
    "analysis.quantized",
    "analysis.transfer_plot",
    "analysis.transfer",
)
# The report's pages of their own an item can be shown on (title by page); default: overview.
PAGES = {
    "instability": "Instability",
    "interventions": "Interventions",
    "paired": "Paired FP32/MX runs",
}
# The metric columns a curve needs; flops and wall_time are left unread.
CURVE_COLUMNS = ("run_id", "step", "tokens", "name", "value")


@dataclass(frozen=True)
class Needs:
    """What an item reads. ``metrics``/``metric_suffixes``: the step metrics by exact name or
    name ending (none: no Parquet is read); ``columns``: the metric columns read;
    ``sweep_only``: needs a sweep folder (skipped for the paper's data under ``all``)."""

    metrics: tuple[str, ...] = ()
    metric_suffixes: tuple[str, ...] = ()
    columns: tuple[str, ...] = CURVE_COLUMNS
    sweep_only: bool = False

    @property
    def reads_metrics(self) -> bool:
        return bool(self.metrics or self.metric_suffixes)

    def describe(self) -> str:
        """E.g. "run summaries; metrics train/loss, *.fc1/a; a sweep folder"."""
        parts = ["run summaries"]
        if self.reads_metrics:
            names = [*self.metrics, *(f"*{s}" for s in self.metric_suffixes)]
            parts.append("metrics " + ", ".join(names))
        if self.sweep_only:
            parts.append("a sweep folder (not --paper)")
        return "; ".join(parts)


SUMMARIES = Needs()
CURVES = Needs(metrics=("train/loss", "optim/grad_norm"))


@dataclass(frozen=True)
class Item:
    """One registered plot or table: ``make(source, out_dir)`` writes its files."""

    kind: str
    name: str
    description: str
    needs: Needs
    make: Callable[[Source, Path], list[Path]]
    page: str | None = None  # the report page it is shown on (None: the overview)


_ITEMS: dict[str, dict[str, Item]] = {kind: {} for kind in KINDS}


def register(
    kind: str, name: str, description: str, needs: Needs = SUMMARIES, page: str | None = None
) -> Callable[[Callable[[Source, Path], list[Path]]], Callable[[Source, Path], list[Path]]]:
    """Decorator: register ``make(source, out_dir) -> paths`` as plot/table ``name``."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; allowed: {', '.join(KINDS)}")
    if page is not None and page not in PAGES:
        raise ValueError(f"unknown report page {page!r}; allowed: {', '.join(PAGES)}")

    def add(make: Callable[[Source, Path], list[Path]]) -> Callable[[Source, Path], list[Path]]:
        known = _ITEMS[kind].get(name)
        if known is not None and known.make.__qualname__ != make.__qualname__:
            raise ValueError(f"{kind} {name!r} is registered twice ({known.make.__module__})")
        _ITEMS[kind][name] = Item(kind, name, description, needs, make, page)
        return make

    return add


def plot(name: str, description: str, needs: Needs = SUMMARIES, page: str | None = None):
    """Register a plot (see :func:`register`)."""
    return register("plot", name, description, needs, page)


def table(name: str, description: str, needs: Needs = SUMMARIES, page: str | None = None):
    """Register a table (see :func:`register`)."""
    return register("table", name, description, needs, page)


def items(kind: str) -> list[Item]:
    """Every registered item of ``kind``, built-in modules imported first."""
    for module in MODULES:
        importlib.import_module(module)
    # Listed modules in their order (whatever imported them first), then any others.
    rank = {module: i for i, module in enumerate(MODULES)}
    return sorted(_ITEMS[kind].values(), key=lambda i: rank.get(i.make.__module__, len(rank)))


def names(kind: str) -> tuple[str, ...]:
    return tuple(item.name for item in items(kind))


def select(kind: str, requested: Sequence[str]) -> list[Item]:
    """The items named in ``requested`` ("all": every one); ValueError names the allowed."""
    known = {item.name: item for item in items(kind)}
    wanted = list(known) if "all" in requested else list(dict.fromkeys(requested))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown {kind} {unknown}; allowed: {', '.join(known)} or 'all'")
    return [known[n] for n in wanted]


def option_help(kind: str) -> str:
    """The ``--plot``/``--table`` option help: every name, then 'all'."""
    return f"{', '.join(names(kind))} or all (repeatable; see below)"


def catalogue(kind: str) -> list[str]:
    """One line per item: name, description and what it needs."""
    return [f"{i.name}: {i.description} (needs {i.needs.describe()})" for i in items(kind)]
