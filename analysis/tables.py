"""Tables: per-configuration fits, instability frequency and the paper's mitigation deltas.

Every ``*_table`` returns a DataFrame; :func:`write_table` writes it as CSV and Markdown.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.configs import BASELINE, config_order
from analysis.instability import frequency_table
from analysis.isoflop import IsoFlopFit
from analysis.joint import JointFit, fit_joint, leave_one_budget_out
from analysis.laws import ConfigLaw
from analysis.registry import CURVES, table

if TYPE_CHECKING:
    from analysis.report import Source


def to_markdown(frame: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub-flavoured Markdown table (no tabulate dependency)."""

    def cell(value: object) -> str:
        if isinstance(value, float | np.floating):
            return "" if np.isnan(value) else format(value, floatfmt)
        return str(value).replace("|", "\\|")

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"


def write_table(
    frame: pd.DataFrame, out_dir: Path, name: str, title: str, note: str = ""
) -> list[Path]:
    """Write ``name.csv`` and ``name.md`` (title, table, note) and return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv, md = out_dir / f"{name}.csv", out_dir / f"{name}.md"
    frame.to_csv(csv, index=False)
    md.write_text(f"# {title}\n\n{to_markdown(frame)}" + (f"\n{note}\n" if note else ""))
    return [csv, md]


def _with_ci(value: float, ci: tuple[float, float] | None) -> str:
    if ci is None:
        return f"{value:.4g}"
    return f"{value:.4g} [{ci[0]:.3g}, {ci[1]:.3g}]"


def fits_table(laws: list[ConfigLaw], target_flops: float) -> pd.DataFrame:
    """One row per configuration: parameters with bootstrap CIs, N_opt and loss at a target C."""
    rows = []
    for law in laws:
        row: dict[str, object] = {"config": law.config, "n_points": len(law.data)}
        fit = law.fit
        if fit is None:
            rows.append({**row, "flags": law.reason})
            continue
        names = ("A", "B", "E", "alpha", "beta") if hasattr(fit, "beta") else ("A", "E", "gamma")
        row.update({k: _with_ci(getattr(fit, k), fit.ci.get(k)) for k in names})
        loss = float(fit.loss_at(target_flops))
        if law.boot is not None:
            lo, hi = law.boot.loss_ci(np.array([target_flops]))
            row["loss_at_target"] = _with_ci(loss, (float(lo[0]), float(hi[0])))
        else:
            row["loss_at_target"] = f"{loss:.4g}"
        if hasattr(fit, "n_opt"):
            row["n_opt_at_target"] = f"{float(fit.n_opt(target_flops)):.3g}"
        row.update(
            {
                "objective": fit.objective,
                "converged": fit.converged,
                "trustworthy": law.drawable,
                "flags": fit.flags(),
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


def forms_table(laws_by_form: dict[str, list[ConfigLaw]], target_flops: float) -> pd.DataFrame:
    """:func:`fits_table` of several forms in one, a configuration's rows next to each other."""
    frames = [
        fits_table(laws, target_flops).assign(form=form) for form, laws in laws_by_form.items()
    ]
    table = pd.concat(frames, ignore_index=True)
    rank = {config: i for i, config in enumerate(dict.fromkeys(table["config"]))}
    table = table.sort_values("config", key=lambda c: c.map(rank), kind="stable")
    return table[["config", "form", *(c for c in table.columns if c not in ("config", "form"))]]


def isoflop_table(
    fits: dict[str, IsoFlopFit], chinchilla: list[ConfigLaw], target_flops: float
) -> pd.DataFrame:
    """Per configuration: the IsoFLOP exponent a (N_opt ∝ C^a) with its CI next to the one the
    Chinchilla fit implies, beta/(alpha+beta), and both N_opt at a target compute."""
    laws = {law.config: law for law in chinchilla}
    rows = []
    for config, iso in fits.items():
        row: dict[str, object] = {
            "config": config,
            "budgets_used": f"{iso.n_used}/{len(iso.budgets)}",
            "a_isoflop": _with_ci(iso.a, iso.ci),
            "k": iso.k,
            "n_opt_isoflop": iso.n_opt(target_flops),
        }
        flags = [iso.flags] if iso.flags else []
        law = laws.get(config)
        if law is not None and law.fit is not None:
            ci = None
            if law.boot is not None:
                lo, hi = law.boot.ci_of(lambda fit: fit.n_opt_exponent)
                ci = (float(lo), float(hi))
            row["a_chinchilla"] = _with_ci(law.fit.n_opt_exponent, ci)
            row["n_opt_chinchilla"] = float(law.fit.n_opt(target_flops))
            if not law.drawable:
                flags.append(f"chinchilla: {law.fit.flags()}")
        row["trustworthy"] = iso.trustworthy
        row["flags"] = "; ".join(flags)
        rows.append(row)
    return pd.DataFrame(rows)


def isoflop_budgets_table(fits: dict[str, IsoFlopFit]) -> pd.DataFrame:
    """Every configuration x budget parabola: sampled N range, minimum and why it was left out."""
    cols = ["budget", "n_sizes", "n_lo", "n_hi", "n_opt", "d_opt", "loss_opt", "used", "flag"]
    frames = [fit.budgets[cols].assign(config=config) for config, fit in fits.items()]
    return pd.concat(frames, ignore_index=True)[["config", *cols]]


def instability_table(
    classified: pd.DataFrame, by: tuple[str, ...] = ("config", "budget")
) -> pd.DataFrame:
    """Wide table: one row per configuration, one "unstable/total" column per budget."""
    freq = frequency_table(classified, by)
    freq["cell"] = freq["unstable"].astype(str) + "/" + freq["total"].astype(str)
    wide = freq.pivot(index=by[0], columns=list(by[1:]), values="cell").fillna("")
    wide.columns = [
        " ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in np.atleast_1d(c))
        for c in wide.columns
    ]
    totals = freq.groupby(by[0])[["unstable", "total"]].sum()
    wide["all"] = totals["unstable"].astype(str) + "/" + totals["total"].astype(str)
    order = config_order(set(wide.index)) if by[0] == "config" else sorted(wide.index)
    return wide.reindex(order).reset_index()


def mitigations_table(runs: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Validation-loss deltas of each configuration against the baseline matched on N and D.

    Losses are averaged over seeds at each (N, D) first; only points both configurations ran
    count. Positive delta = worse than the baseline.
    """
    if baseline not in set(runs["config"]):
        raise ValueError(
            f"baseline configuration {baseline!r} has no runs; have {sorted(set(runs['config']))}"
        )
    keys = ["n_params", "tokens"]
    losses = ["final_val_loss", "min_val_loss"]
    means = runs.groupby(["config", *keys])[losses].mean().reset_index()
    base = means[means["config"] == baseline].drop(columns="config")
    merged = means[means["config"] != baseline].merge(base, on=keys, suffixes=("", "_base"))
    rows = []
    for config in config_order(set(merged["config"])):
        m = merged[merged["config"] == config]
        d_final = m["final_val_loss"] - m["final_val_loss_base"]
        d_min = m["min_val_loss"] - m["min_val_loss_base"]
        rows.append(
            {
                "config": config,
                "matched": len(m),
                "mean_delta_final": d_final.mean(),
                "median_delta_final": d_final.median(),
                "max_delta_final": d_final.max(),
                "mean_delta_min": d_min.mean(),
                "frac_worse_0.01": float((d_final > 0.01).mean()),
            }
        )
    return pd.DataFrame(rows)


def joint_table(fit: JointFit) -> tuple[pd.DataFrame, str]:
    """Per-configuration effective-parameter factors of the joint law, plus a note with the
    shared parameters and fit diagnostics."""
    frame = pd.DataFrame(
        {"config": list(fit.efficiency), "efficiency_f": list(fit.efficiency.values())}
    )
    frame["reference"] = frame["config"] == fit.reference
    note = (
        f"Shared: E={fit.E:.4g}, A={fit.A:.4g}, B={fit.B:.4g}, alpha={fit.alpha:.4g}, "
        f"beta={fit.beta:.4g}; {fit.n_points} runs, objective {fit.objective:.4g}, "
        f"converged={fit.converged}. {fit.flags() or 'No flags.'} "
        "f < 1: the format behaves like a model with f times fewer parameters."
    )
    return frame, note


# The registered tables (analysis.registry): what `sweep analyze --table` offers.
@table("fits", "L(N, D), L(C), joint-law and leave-one-budget-out fits per configuration")
def _fits(src: Source, out_dir: Path) -> list[Path]:
    target = 10 * float(src.runs["budget"].max())
    title = f"fits per configuration (95% bootstrap CI; target C = {target:.3g})"
    nd_laws = {"chinchilla": src.chinchilla_laws, "kaplan": src.kaplan_laws}
    paths = write_table(
        forms_table(nd_laws, target), out_dir, "fits_chinchilla", f"L(N, D) {title}"
    )
    paths += write_table(
        fits_table(src.compute_laws, target), out_dir, "fits_compute", f"L(C) {title}"
    )
    joint, note = joint_table(fit_joint(src.runs))
    paths += write_table(
        joint,
        out_dir,
        "fits_joint",
        "Joint precision-aware law L = E + A/(N f)^alpha + B/D^beta",
        note,
    )
    return paths + write_table(
        leave_one_budget_out(src.runs),
        out_dir,
        "fits_lobo",
        "Leave-one-budget-out error: per-configuration vs joint law (mean |pred/actual - 1|)",
    )


@table("instability", "unstable / total runs per budget and per d_model", CURVES, "instability")
def _instability(src: Source, out_dir: Path) -> list[Path]:
    classified = src.classified()
    t = src.thresholds
    note = (
        f"Unstable = diverged, final - best val loss > {t.tau}, or a "
        f"{t.ma_window}-point moving-average loss rise > {t.ma_slope} per point."
    )
    paths = write_table(
        instability_table(classified),
        out_dir,
        "instability",
        "Unstable / total runs per compute budget",
        note,
    )
    by_shape = instability_table(classified, by=("config", "d_model"))
    return paths + write_table(
        by_shape, out_dir, "instability_by_shape", "Unstable / total runs per d_model", note
    )


@table("mitigations", "validation-loss delta of each configuration vs bf16_bf16, matched on N, D")
def _mitigations(src: Source, out_dir: Path) -> list[Path]:
    return write_table(
        mitigations_table(src.runs),
        out_dir,
        "mitigations",
        "Validation-loss delta vs bf16_bf16, matched on N and D",
    )


@table("isoflop", "IsoFLOP exponent a (N_opt ∝ C^a) vs the Chinchilla fit's, per configuration")
def _isoflop(src: Source, out_dir: Path) -> list[Path]:
    target = 10 * float(src.runs["budget"].max())
    paths = write_table(
        isoflop_table(src.isoflop_fits, src.chinchilla_laws, target),
        out_dir,
        "isoflop",
        f"IsoFLOP a (N_opt ∝ C^a) vs Chinchilla beta/(alpha+beta); N_opt at C = {target:.3g}",
        "Parabolas of min val loss vs log N per budget; a budget whose minimum lies outside "
        "its sampled N range is left out (see isoflop_budgets). CIs: 95% bootstrap.",
    )
    return paths + write_table(
        isoflop_budgets_table(src.isoflop_fits),
        out_dir,
        "isoflop_budgets",
        "IsoFLOP parabola minimum per configuration and budget",
    )
