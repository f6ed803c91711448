"""The one entry point the CLI calls: ``analyze`` writes the requested figures and tables.

What can be asked for is :mod:`analysis.registry`: each plot/table registers itself in the
module that defines it; a :class:`Source` loads the step metrics an item needs only when it
asks (pushdown: only those metric names and columns are read).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import registry
from analysis.index import write_index
from analysis.instability import DEFAULT, Thresholds, classify_runs
from analysis.isoflop import IsoFlopFit, isoflop_fits
from analysis.laws import N_BOOT, ConfigLaw, chinchilla_laws, compute_laws, kaplan_laws
from analysis.load import load_metrics, load_paper_curves, load_paper_runs, load_sweep_runs
from analysis.registry import CURVES, Item, Needs
from analysis.transfer import BASELINE, HeldOut, evaluate

# The names every analysis offers (registration order); see analysis.registry.
PLOTS = registry.names("plot")
TABLES = registry.names("table")
CURVE_NAMES = CURVES.metrics
# The paper's curves have 20-65 logged points, too few for the per-step defaults.
PAPER_THRESHOLDS = Thresholds(window=10, ma_window=5)


@dataclass
class Source:
    """Runs of one source; step metrics are loaded on demand (:meth:`metrics`).

    Laws are fitted once per source and shared by the figures and tables that need them.
    """

    label: str
    runs: pd.DataFrame
    thresholds: Thresholds
    n_boot: int = N_BOOT
    sweep_dir: Path | None = None
    transfer_base: str = BASELINE
    transfer_cutoff: float | None = None
    _metrics: dict[Needs, pd.DataFrame | None] = field(default_factory=dict, repr=False)

    def metrics(self, needs: Needs) -> pd.DataFrame | None:
        """The step metrics ``needs`` names (only those are read), joined onto the runs'
        ratio and config; None when the source has none of them."""
        if needs not in self._metrics:
            self._metrics[needs] = self._load_metrics(needs)
        return self._metrics[needs]

    def _load_metrics(self, needs: Needs) -> pd.DataFrame | None:
        if self.sweep_dir is None:  # the paper ships train/loss and optim/grad_norm only
            curves = load_paper_curves()
            keep = curves["name"].isin(needs.metrics)
            if needs.metric_suffixes:
                keep |= curves["name"].str.endswith(needs.metric_suffixes)
            curves = curves[keep].reset_index(drop=True)
            return curves if len(curves) else None
        metrics = load_metrics(
            self.sweep_dir,
            names=needs.metrics,
            suffixes=needs.metric_suffixes,
            columns=needs.columns,
        )
        return _join_runs(metrics, self.runs) if len(metrics) else None

    @property
    def curves(self) -> pd.DataFrame | None:
        """Train loss and grad norm (None when the source has no step metrics)."""
        return self.metrics(CURVES)

    def sweep_folder(self, what: str) -> Path:
        """The sweep folder, for what only a sweep has (paired runs, branches)."""
        if self.sweep_dir is None:
            raise ValueError(f"{what} needs a sweep folder; {self.label} has none")
        return self.sweep_dir

    def classified(self) -> pd.DataFrame:
        # Paper curves carry the logger's run ids, which do not join onto the run table.
        metrics = self.curves if self.label != "paper" else None
        return classify_runs(self.runs, metrics, self.thresholds)

    @cached_property
    def compute_laws(self) -> list[ConfigLaw]:
        return compute_laws(self.runs, n_boot=self.n_boot)

    @cached_property
    def chinchilla_laws(self) -> list[ConfigLaw]:
        return chinchilla_laws(self.runs, n_boot=self.n_boot)

    @cached_property
    def kaplan_laws(self) -> list[ConfigLaw]:
        return kaplan_laws(self.runs, n_boot=self.n_boot)

    @cached_property
    def isoflop_fits(self) -> dict[str, IsoFlopFit]:
        return isoflop_fits(self.runs)

    @cached_property
    def held_out(self) -> HeldOut:
        return evaluate(self.runs, self.transfer_base, self.transfer_cutoff, n_boot=self.n_boot)


def _join_runs(metrics: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Metrics rows of the runs in ``runs`` with each run's ratio and config, joined through
    the categorical run_id's categories: millions of rows, no per-row string work."""
    info = runs.drop_duplicates("run_id")
    known = pd.Index(info["run_id"].astype(str))
    position = known.get_indexer(metrics["run_id"].cat.categories.astype(str)).astype(np.int32)
    # Code -1 (no run id) picks the appended -1: "not in the run table".
    row = np.append(position, np.int32(-1))[metrics["run_id"].cat.codes.to_numpy()]
    if (row < 0).any():  # metrics of folders not in the run table
        metrics, row = metrics[row >= 0].reset_index(drop=True), row[row >= 0]
    config = pd.Categorical(info["config"].astype(str))
    metrics["ratio"] = info["ratio"].to_numpy(float)[row]
    metrics["config"] = pd.Categorical.from_codes(config.codes[row], config.categories)
    return metrics


def load_source(sweep_dir: Path | None, paper: bool) -> Source:
    """Load the runs of the paper's shipped data or of a sweep folder (metrics: on demand)."""
    if paper == (sweep_dir is not None):
        raise ValueError(
            "give exactly one source: a sweep folder or paper=True "
            f"(got sweep_dir={sweep_dir}, paper={paper})"
        )
    if paper:
        return Source("paper", load_paper_runs(), PAPER_THRESHOLDS)
    runs = load_sweep_runs(Path(sweep_dir))
    return Source(f"sweep {sweep_dir}", runs, DEFAULT, sweep_dir=Path(sweep_dir))


def make(item: Item, src: Source, out_dir: Path) -> list[Path]:
    """Write one registered plot/table of ``src``; ValueError when the source lacks its input."""
    if item.needs.sweep_only:
        src.sweep_folder(f"{item.kind} '{item.name}'")
    return item.make(src, out_dir)


@dataclass
class Analysis:
    """What :func:`analyze_items` wrote: each item with its files, the skipped ones (with
    why) and the index.md."""

    made: list[tuple[Item, list[Path]]]
    skipped: list[tuple[Item, str]]
    index: Path

    @property
    def paths(self) -> list[Path]:
        return [p for _, paths in self.made for p in paths] + [self.index]


def analyze_items(
    src: Source, plots: Sequence[str], tables: Sequence[str], out_dir: Path
) -> Analysis:
    """Write the requested registered plots/tables of a loaded source and the index.md.

    Asked for by name, an item the source cannot make raises its ValueError; via "all" it is
    skipped with the reason."""
    jobs = [(i, "all" in plots) for i in registry.select("plot", plots)]
    jobs += [(i, "all" in tables) for i in registry.select("table", tables)]
    out_dir = Path(out_dir)
    made: list[tuple[Item, list[Path]]] = []
    skipped: list[tuple[Item, str]] = []
    for item, from_all in jobs:
        try:
            made.append((item, make(item, src, out_dir)))
        except ValueError as err:
            if not from_all:
                raise
            skipped.append((item, str(err)))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [p for _, written in made for p in written]
    reasons = [f"{item.name}: {why}" for item, why in skipped]
    return Analysis(made, skipped, write_index(out_dir, paths, f"Analysis of {src.label}", reasons))


def analyze(
    sweep_dir: Path | None,
    *,
    paper: bool,
    plots: Sequence[str],
    tables: Sequence[str],
    out_dir: Path,
    n_boot: int = N_BOOT,
    base: str = BASELINE,
    cutoff: float | None = None,
    source: Source | None = None,
) -> list[Path]:
    """Write the requested figures (PNG and PDF) and tables (Markdown and CSV) into out_dir
    and an index.md linking them; return the paths written. "all" in plots/tables expands to
    every registered item (analysis.registry). ``base`` and ``cutoff`` configure the transfer
    table/plot (the held-out evaluation; cutoff None: the lower median budget). ``source``:
    an already loaded :func:`load_source` to reuse. Raise ValueError with a clear message for
    an unknown plot/table name, a folder with no runs, or a plot that needs data the source
    lacks (e.g. curves for a sweep without metrics)."""
    # Unknown names fail before anything is loaded.
    registry.select("plot", plots)
    registry.select("table", tables)
    src = source or load_source(sweep_dir, paper)
    src.n_boot = n_boot
    src.transfer_base, src.transfer_cutoff = base, cutoff
    return analyze_items(src, plots, tables, out_dir).paths
