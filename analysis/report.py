"""The one entry point the CLI calls: ``analyze`` writes the requested figures and tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd

from analysis import figures, transfer
from analysis import tables as tbl
from analysis.confound import confound_runs, confound_table, plot_confound
from analysis.index import write_index
from analysis.instability import DEFAULT, Thresholds, classify_runs, frequency_table
from analysis.interventions import describe, outcome_counts, outcome_table, plot_interventions
from analysis.isoflop import IsoFlopFit, isoflop_fits
from analysis.joint import fit_joint, leave_one_budget_out
from analysis.laws import N_BOOT, ConfigLaw, chinchilla_laws, compute_laws, kaplan_laws
from analysis.load import load_metrics, load_paper_curves, load_paper_runs, load_sweep_runs
from analysis.paired import paired_table, plot_paired
from analysis.quantized import plot_quantized
from analysis.transfer import BASELINE, HeldOut, evaluate
from analysis.transfer_plot import plot_transfer

PLOTS = (
    "scaling",
    "contours",
    "curves",
    "instability",
    "frontier",
    "paired",
    "interventions",
    "isoflop",
    "confound",
    "quantized",
    "transfer",
)
TABLES = (
    "fits",
    "instability",
    "mitigations",
    "interventions",
    "paired",
    "isoflop",
    "confound",
    "transfer",
)
CURVE_NAMES = ("train/loss", "optim/grad_norm")
# The paper's curves have 20-65 logged points, too few for the per-step defaults.
PAPER_THRESHOLDS = Thresholds(window=10, ma_window=5)


@dataclass
class Source:
    """Runs of one source plus its curves (None when it has no step metrics).

    Laws are fitted once per source and shared by the figures and tables that need them.
    """

    label: str
    runs: pd.DataFrame
    curves: pd.DataFrame | None
    thresholds: Thresholds
    n_boot: int = N_BOOT
    sweep_dir: Path | None = None
    transfer_base: str = BASELINE
    transfer_cutoff: float | None = None

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


def load_source(sweep_dir: Path | None, paper: bool) -> Source:
    """Load the paper's shipped data or a sweep folder (runs + loss/grad-norm curves)."""
    if paper == (sweep_dir is not None):
        raise ValueError(
            "give exactly one source: a sweep folder or paper=True "
            f"(got sweep_dir={sweep_dir}, paper={paper})"
        )
    if paper:
        return Source("paper", load_paper_runs(), load_paper_curves(), PAPER_THRESHOLDS)
    runs = load_sweep_runs(Path(sweep_dir))
    metrics = load_metrics(Path(sweep_dir), names=CURVE_NAMES)
    curves = None
    if len(metrics):
        metrics["run_id"] = metrics["run_id"].astype(str)
        curves = metrics.merge(runs[["run_id", "ratio", "config"]], on="run_id", how="inner")
    return Source(f"sweep {sweep_dir}", runs, curves, DEFAULT, sweep_dir=Path(sweep_dir))


def _expand(requested: Sequence[str], allowed: tuple[str, ...], kind: str) -> list[str]:
    names = list(allowed) if "all" in requested else list(dict.fromkeys(requested))
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValueError(f"unknown {kind} {unknown}; allowed: {', '.join(allowed)} or 'all'")
    return names


def _make_plot(name: str, src: Source, out_dir: Path) -> list[Path]:
    if name == "confound":
        sweep_dir = src.sweep_folder("plot 'confound'")
        return plot_confound(sweep_dir, confound_runs(sweep_dir), out_dir)
    if name == "scaling":
        return figures.plot_scaling(src.runs, src.compute_laws, out_dir)
    if name == "contours":
        return figures.plot_contours(src.runs, src.chinchilla_laws, out_dir)
    if name == "curves":
        if src.curves is None or src.curves.empty:
            raise ValueError(
                f"plot 'curves' needs step metrics (train/loss) and {src.label} has none"
            )
        return figures.plot_curves(src.curves, out_dir)
    if name == "instability":
        return figures.plot_instability(frequency_table(src.classified()), out_dir)
    if name == "isoflop":
        return figures.plot_isoflop(src.isoflop_fits, out_dir)
    if name == "quantized":
        return plot_quantized(src.runs, out_dir)
    if name == "transfer":
        return plot_transfer(src.runs, src.held_out, out_dir)
    if name == "paired":
        return plot_paired(src.sweep_folder("plot 'paired'"), out_dir)
    if name == "interventions":
        sweep_dir = src.sweep_folder("plot 'interventions'")
        return plot_interventions(sweep_dir, outcome_table(sweep_dir), out_dir)
    return figures.plot_frontier(src.runs, out_dir)


def _make_table(name: str, src: Source, out_dir: Path) -> list[Path]:
    if name == "confound":
        runs = confound_runs(src.sweep_folder("table 'confound'"))
        paths = tbl.write_table(
            confound_table(runs),
            out_dir,
            "confound",
            "LN-bias confound: which configurations diverge, and when",
            "trouble = first loss spike, moving-average rise or divergence (train loss).",
        )
        return paths + tbl.write_table(runs, out_dir, "confound_runs", "Confound runs")
    if name == "paired":
        table = paired_table(src.sweep_folder("table 'paired'"))
        title = "Paired FP32/MX runs: final losses and which one got into trouble"
        return tbl.write_table(table, out_dir, "paired", title)
    if name == "interventions":
        table = outcome_table(src.sweep_folder("table 'interventions'"))
        title = "Intervention outcomes per arm (diverged / delayed / averted / stable)"
        paths = tbl.write_table(table, out_dir, "interventions", title, describe(table))
        return paths + tbl.write_table(
            outcome_counts(table), out_dir, "interventions_counts", "Outcomes per arm"
        )
    if name == "instability":
        classified = src.classified()
        note = (
            f"Unstable = diverged, final - best val loss > {src.thresholds.tau}, or a "
            f"{src.thresholds.ma_window}-point moving-average loss rise > "
            f"{src.thresholds.ma_slope} per point."
        )
        paths = tbl.write_table(
            tbl.instability_table(classified),
            out_dir,
            "instability",
            "Unstable / total runs per compute budget",
            note,
        )
        by_shape = tbl.instability_table(classified, by=("config", "d_model"))
        return paths + tbl.write_table(
            by_shape, out_dir, "instability_by_shape", "Unstable / total runs per d_model", note
        )
    if name == "mitigations":
        table = tbl.mitigations_table(src.runs)
        return tbl.write_table(
            table, out_dir, "mitigations", "Validation-loss delta vs bf16_bf16, matched on N and D"
        )
    if name == "transfer":
        return _transfer_tables(src.held_out, out_dir)
    target = 10 * float(src.runs["budget"].max())
    if name == "isoflop":
        table = tbl.isoflop_table(src.isoflop_fits, src.chinchilla_laws, target)
        paths = tbl.write_table(
            table,
            out_dir,
            "isoflop",
            f"IsoFLOP a (N_opt ∝ C^a) vs Chinchilla beta/(alpha+beta); N_opt at C = {target:.3g}",
            "Parabolas of min val loss vs log N per budget; a budget whose minimum lies outside "
            "its sampled N range is left out (see isoflop_budgets). CIs: 95% bootstrap.",
        )
        return paths + tbl.write_table(
            tbl.isoflop_budgets_table(src.isoflop_fits),
            out_dir,
            "isoflop_budgets",
            "IsoFLOP parabola minimum per configuration and budget",
        )
    title = f"fits per configuration (95% bootstrap CI; target C = {target:.3g})"
    nd_laws = {"chinchilla": src.chinchilla_laws, "kaplan": src.kaplan_laws}
    paths = tbl.write_table(
        tbl.forms_table(nd_laws, target), out_dir, "fits_chinchilla", f"L(N, D) {title}"
    )
    paths += tbl.write_table(
        tbl.fits_table(src.compute_laws, target), out_dir, "fits_compute", f"L(C) {title}"
    )
    joint, note = tbl.joint_table(fit_joint(src.runs))
    paths += tbl.write_table(
        joint,
        out_dir,
        "fits_joint",
        "Joint precision-aware law L = E + A/(N f)^alpha + B/D^beta",
        note,
    )
    lobo = leave_one_budget_out(src.runs)
    paths += tbl.write_table(
        lobo,
        out_dir,
        "fits_lobo",
        "Leave-one-budget-out error: per-configuration vs joint law (mean |pred/actual - 1|)",
    )
    return paths


def _transfer_tables(result: HeldOut, out_dir: Path) -> list[Path]:
    cut = f"budgets <= {result.cutoff:.3g}"
    note = (
        f"Fitted on {cut}; every budget above is predicted ({result.base}'s observed loss "
        "there is the transfer's input). "
        "observed: lowest final val loss at the budget; transfer: "
        f"K(L_{result.base} - E_1)^kappa + E_2 with its 95% bootstrap CI; own: the "
        "configuration's own L(C); joint: the joint precision law at the best of the budget's "
        "(N, D) points; departed: observed above transfer_hi."
    )
    paths = tbl.write_table(
        result.table, out_dir, "transfer", f"Held-out predictions vs {result.base}", note
    )
    paths += tbl.write_table(
        transfer.summary(result.table),
        out_dir,
        "transfer_summary",
        f"Held-out relative error per method ({cut})",
        "closest: rows where the method is nearest the observed loss; in_interval: observed "
        "inside the method's 95% interval. fully MX: MX weights and activations, both passes.",
    )
    paths += tbl.write_table(
        transfer.departures(result.table),
        out_dir,
        "transfer_departures",
        "First held-out budget where the observed loss exceeds the transfer interval",
    )
    return paths + tbl.write_table(
        transfer.fits_table(result),
        out_dir,
        "transfer_fits",
        f"Transfer fits L = K(L_{result.base} - E_1)^kappa + E_2 ({cut}; 95% bootstrap CI)",
    )


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
    every item. ``base`` and ``cutoff`` configure the transfer table/plot (the held-out
    evaluation; cutoff None: the lower median budget). ``source``: an already loaded
    :func:`load_source` to reuse. Raise ValueError with a clear message for an unknown
    plot/table name, a folder with no runs, or a plot that needs data the source lacks (e.g.
    curves for a sweep without metrics)."""
    plot_names = _expand(plots, PLOTS, "plot")
    table_names = _expand(tables, TABLES, "table")
    src = source or load_source(sweep_dir, paper)
    src.n_boot = n_boot
    src.transfer_base, src.transfer_cutoff = base, cutoff
    out_dir = Path(out_dir)
    paths: list[Path] = []
    skipped: list[str] = []
    jobs = [(n, _make_plot, "all" in plots) for n in plot_names]
    jobs += [(n, _make_table, "all" in tables) for n in table_names]
    for name, make, from_all in jobs:
        try:
            paths += make(name, src, out_dir)
        except ValueError as err:
            # Asked for by name: the caller must hear why. Via "all": skip what this source lacks.
            if not from_all:
                raise
            skipped.append(f"{name}: {err}")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths.append(write_index(out_dir, paths, f"Analysis of {src.label}", skipped))
    return paths
