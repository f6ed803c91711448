"""The paper's figures (and this project's extensions), drawn with matplotlib's Agg backend.

Each ``plot_*`` function takes tidy frames, writes ``<name>.png`` and ``<name>.pdf`` into
``out_dir`` and returns both paths. Configurations keep one colour everywhere
(:func:`analysis.configs.config_color`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from analysis.configs import FORMATS, config_color, config_order  # noqa: E402
from analysis.instability import frequency_table  # noqa: E402
from analysis.isoflop import IsoFlopFit  # noqa: E402
from analysis.laws import ConfigLaw, usable  # noqa: E402
from analysis.registry import CURVES, plot  # noqa: E402

if TYPE_CHECKING:
    from analysis.report import Source

plt.rcParams.update({"font.size": 9, "axes.titlesize": 9, "legend.fontsize": 7})
SINGLE_AXES_MAX = 6  # more configurations than this get one panel each
CLIP_ABOVE_ENVELOPE = 1.25


def save(
    fig: plt.Figure, out_dir: Path, name: str, formats: tuple[str, ...] = ("png", "pdf")
) -> list[Path]:
    """Write ``fig`` as PNG and PDF (or ``formats``) and close it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.{ext}" for ext in formats]
    for path in paths:
        fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return paths


def _panels(n: int, ncols: int = 4, size: tuple[float, float] = (3.4, 2.8)):
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(size[0] * ncols, size[1] * nrows),
        squeeze=False,
        constrained_layout=True,
    )
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _log_axes(ax: plt.Axes, x: bool = True, y: bool = False) -> None:
    """Log scale without minor tick labels (they collide on ranges under a decade)."""
    if x:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    if y:
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())


def _draw_compute_law(ax: plt.Axes, law: ConfigLaw, runs: pd.DataFrame, loss: str) -> None:
    color = config_color(law.config)
    ok = usable(runs[runs["config"] == law.config], loss)
    ax.scatter(ok["flops"], ok[loss], s=10, color=color, alpha=0.3, linewidths=0)
    ax.scatter(
        law.data["flops"],
        law.data[loss],
        s=28,
        color=color,
        edgecolors="k",
        linewidths=0.5,
        label=f"{law.config} (best per budget)",
    )
    fit = law.fit
    if fit is None or not law.drawable:
        if fit is not None or law.reason:
            ax.plot([], [], " ", label=f"  no law drawn: {law.label_note}")
        return
    grid = np.geomspace(law.data["flops"].min() / 1.5, law.data["flops"].max() * 1.5, 100)
    note = f" [{fit.flags()}]" if fit.flags() else ""
    ax.plot(
        grid,
        fit.predict(grid),
        color=color,
        ls="--" if fit.underdetermined else "-",
        label=f"  L = {fit.E:.4g} + {fit.A:.3g}·C^-{fit.gamma:.3f}{note}",
    )
    if law.boot is not None:
        lo, hi = law.boot.loss_ci(grid)
        ax.fill_between(grid, lo, hi, color=color, alpha=0.15, linewidth=0)


def _entropy_rate(runs: pd.DataFrame) -> float | None:
    """The corpus's true entropy rate when every run that knows one agrees on it (synthetic)."""
    if "entropy_rate" not in runs:
        return None
    rates = runs["entropy_rate"].astype(float).dropna().round(6).unique()
    return float(rates[0]) if len(rates) == 1 else None


def plot_scaling(
    runs: pd.DataFrame, laws: list[ConfigLaw], out_dir: Path, loss: str = "final_val_loss"
) -> list[Path]:
    """Loss vs training FLOPs per configuration with L(C) fits on the lower envelope."""
    if len(laws) <= SINGLE_AXES_MAX:
        fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
        axes = [ax] * len(laws)
    else:
        fig, axes = _panels(len(laws))
    worst_best: dict[plt.Axes, float] = {}
    for ax, law in zip(axes, laws, strict=True):
        _draw_compute_law(ax, law, runs, loss)
        if len(law.data):
            worst_best[ax] = max(worst_best.get(ax, 0.0), float(law.data[loss].max()))
    entropy = _entropy_rate(runs)
    for ax in dict.fromkeys(axes):
        if entropy is not None:
            ax.axhline(
                entropy,
                color="k",
                ls=":",
                lw=1,
                label=f"true entropy rate H = {entropy:.4g} (vs each fit's E)",
            )
        if ax in worst_best:
            # Diverged runs (loss 2-5x the envelope) would otherwise flatten every curve.
            ax.set_ylim(top=CLIP_ABOVE_ENVELOPE * worst_best[ax])
        _log_axes(ax)
        ax.set_xlabel("training FLOPs C")
        ax.set_ylabel(f"{loss.replace('_', ' ')} (nats/token)")
        ax.legend(loc="upper right")
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(
        "Loss vs compute: L(C) = E + A·C^-γ per configuration (band: bootstrap 95% CI; "
        f"dashed: under-determined; y clipped at {CLIP_ABOVE_ENVELOPE}x the envelope)"
    )
    return save(fig, out_dir, "scaling")


def plot_contours(
    runs: pd.DataFrame, laws: list[ConfigLaw], out_dir: Path, loss: str = "min_val_loss"
) -> list[Path]:
    """Weight x activation grid of FLOPs vs params coloured by loss, with fitted contours."""
    by_config = {law.config: law for law in laws}
    base = runs[runs["variant"] == ""]
    w_fmts = [f for f in FORMATS if f in set(base["w_fmt"])]
    a_fmts = [f for f in FORMATS if f in set(base["a_fmt"])]
    ok = usable(base, loss)
    if ok.empty:
        raise ValueError(f"no runs with a finite {loss} to draw contours")
    norm = Normalize(ok[loss].quantile(0.02), ok[loss].quantile(0.98))
    fig, axes = plt.subplots(
        len(w_fmts),
        len(a_fmts),
        figsize=(3 * len(a_fmts), 2.6 * len(w_fmts)),
        squeeze=False,
        sharex=True,
        sharey=True,
        constrained_layout=True,
    )
    c_grid = np.geomspace(ok["flops"].min() / 2, ok["flops"].max() * 2, 80)
    n_grid = np.geomspace(ok["n_params"].min() / 2, ok["n_params"].max() * 2, 80)
    for (i, w), (j, a) in ((x, y) for x in enumerate(w_fmts) for y in enumerate(a_fmts)):
        ax = axes[i][j]
        config = f"{w}_{a}"
        sub = ok[ok["config"] == config]
        ax.set_title(config, color=config_color(config))
        if sub.empty:
            ax.text(0.5, 0.5, "no runs", transform=ax.transAxes, ha="center", color="grey")
        scatter = ax.scatter(
            sub["flops"],
            sub["n_params"],
            c=sub[loss],
            cmap="viridis_r",
            norm=norm,
            s=14,
            edgecolors="k",
            linewidths=0.3,
        )
        law = by_config.get(config)
        if law and law.fit is not None and law.drawable:
            cc, nn = np.meshgrid(c_grid, n_grid)
            levels = np.linspace(norm.vmin, norm.vmax, 8)
            ax.contour(
                cc,
                nn,
                law.fit.predict(nn, cc / (6 * nn)),
                levels=levels,
                cmap="viridis_r",
                norm=norm,
                linewidths=0.7,
            )
            ax.plot(c_grid, law.fit.n_opt(c_grid), "r-", lw=1.2, label="N_opt(C)")
            ax.legend(loc="upper left")
        elif law and not sub.empty:
            ax.text(
                0.03, 0.92, f"no law: {law.label_note}"[:48], transform=ax.transAxes, fontsize=6
            )
        _log_axes(ax, x=True, y=True)
        if i == len(w_fmts) - 1:
            ax.set_xlabel(f"FLOPs (activations {a})")
        if j == 0:
            ax.set_ylabel(f"params N (weights {w})")
    fig.colorbar(scatter, ax=axes, label=loss.replace("_", " "), shrink=0.6)
    fig.suptitle(
        "Chinchilla fits per weight x activation format: contours of L(N, C/6N), red: N_opt(C)"
    )
    return save(fig, out_dir, "contours")


def plot_curves(
    curves: pd.DataFrame, out_dir: Path, formats: tuple[str, ...] = ("png", "pdf")
) -> list[Path]:
    """Train-loss and grad-norm curves per configuration, coloured by tokens/param ratio.

    ``curves``: long frame with run_id, step, name, value, ratio, config.
    """
    names = ("train/loss", "optim/grad_norm")
    configs = config_order(set(curves["config"]))
    fig, axes = plt.subplots(
        len(configs), 2, figsize=(9, 2.8 * len(configs)), squeeze=False, constrained_layout=True
    )
    ratios = curves["ratio"].astype(float)
    norm = LogNorm(ratios.min(), max(ratios.max(), ratios.min() * 1.01))
    cmap = plt.get_cmap("plasma")
    for row, config in zip(axes, configs, strict=True):
        sub = curves[curves["config"] == config]
        for ax, name in zip(row, names, strict=True):
            for (_, ratio), g in sub[sub["name"] == name].groupby(
                ["run_id", "ratio"], observed=True
            ):
                ax.plot(g["step"], g["value"], color=cmap(norm(ratio)), lw=0.8)
            ax.set_title(f"{config}: {name}", color=config_color(config))
            ax.set_xlabel("step")
            ax.set_yscale("log")
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=axes, label="tokens / param")
    return save(fig, out_dir, "curves", formats)


def _color_ticklabels(ax: plt.Axes) -> None:
    for label in ax.get_yticklabels():
        label.set_color(config_color(label.get_text()))


def _budget_label(budget: float) -> str:
    return f"{budget:.2g}"


def plot_instability(freq: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Heatmap of the unstable fraction per configuration x compute budget ("u/t" in cells)."""
    configs = config_order(set(freq["config"]))
    budgets = sorted(freq["budget"].unique())
    frac = freq.pivot(index="config", columns="budget", values="fraction").reindex(configs)[budgets]
    fig, ax = plt.subplots(
        figsize=(1.1 * len(budgets) + 3, 0.35 * len(configs) + 1.5), constrained_layout=True
    )
    image = ax.imshow(frac.to_numpy(float), cmap="Reds", vmin=0, vmax=1, aspect="auto")
    for row in freq.itertuples():
        ax.text(
            budgets.index(row.budget),
            configs.index(row.config),
            f"{row.unstable}/{row.total}",
            ha="center",
            va="center",
            fontsize=7,
            color="white" if row.fraction > 0.6 else "black",  # stay readable on dark cells
        )
    ax.set_xticks(range(len(budgets)), [_budget_label(b) for b in budgets], rotation=45)
    ax.set_yticks(range(len(configs)), configs)
    _color_ticklabels(ax)
    ax.set_xlabel("compute budget (FLOPs)")
    fig.colorbar(image, ax=ax, label="unstable fraction")
    ax.set_title("Unstable runs / runs (diverged, final - best val loss > tau, or loss-rise onset)")
    return save(fig, out_dir, "instability")


def plot_frontier(runs: pd.DataFrame, out_dir: Path, clip: float = 0.2) -> list[Path]:
    """Final - best validation loss over (params x tokens), one panel per configuration."""
    configs = config_order(set(runs["config"]))
    fig, axes = _panels(len(configs))
    norm = Normalize(0, clip)
    for ax, config in zip(axes, configs, strict=True):
        sub = runs[runs["config"] == config]
        gap = (sub["final_val_loss"] - sub["min_val_loss"]).clip(0, clip)
        finite = np.isfinite(gap)
        image = ax.scatter(
            sub["n_params"][finite],
            sub["tokens"][finite],
            c=gap[finite],
            cmap="magma_r",
            norm=norm,
            marker="s",
            s=22,
            edgecolors="grey",
            linewidths=0.3,
        )
        ax.scatter(
            sub["n_params"][~finite],
            sub["tokens"][~finite],
            marker="x",
            color="k",
            s=14,
            label="no loss (diverged/failed)",
        )
        _log_axes(ax, x=True, y=True)
        ax.set_title(config, color=config_color(config))
        ax.set_xlabel("params N")
        ax.set_ylabel("tokens D")
    fig.colorbar(image, ax=axes, label=f"final - best val loss (clipped at {clip})", shrink=0.7)
    fig.suptitle("Where training stops recovering: final minus best validation loss")
    return save(fig, out_dir, "frontier")


def plot_isoflop(fits: dict[str, IsoFlopFit], out_dir: Path) -> list[Path]:
    """Loss vs N per compute budget with the fitted parabolas and their minima N_opt(C)."""
    if not fits:
        raise ValueError("no configurations to draw IsoFLOP curves for")
    fig, axes = _panels(len(fits))
    budgets = np.concatenate([fit.budgets["budget"].to_numpy(float) for fit in fits.values()])
    norm = LogNorm(budgets.min(), max(budgets.max(), budgets.min() * 1.01))
    cmap = plt.get_cmap("viridis")
    for ax, (config, fit) in zip(axes, fits.items(), strict=True):
        for row in fit.budgets.itertuples():
            color = cmap(norm(row.budget))
            runs = fit.data[fit.data["budget"] == row.budget]
            ax.scatter(runs["n_params"], runs[fit.loss], s=9, color=color, linewidths=0)
            if row.n_sizes < 3:
                continue
            grid = np.geomspace(row.n_lo, row.n_hi, 60)
            ax.plot(
                grid,
                fit.parabola(row.budget, grid),
                color=color,
                lw=0.9,
                ls="-" if row.used else ":",
            )
            if row.used:
                ax.scatter(
                    row.n_opt,
                    row.loss_opt,
                    marker="*",
                    s=70,
                    color=color,
                    edgecolors="k",
                    linewidths=0.5,
                    zorder=3,
                )
        if len(fit.data):
            # Diverged-but-finite runs would otherwise flatten every parabola.
            floor = fit.data.groupby("budget")[fit.loss].min().max()
            ax.set_ylim(fit.data[fit.loss].min() * 0.98, CLIP_ABOVE_ENVELOPE * floor)
        ci = f" [{fit.ci[0]:.2f}, {fit.ci[1]:.2f}]" if fit.ci else ""
        law = f"a = {fit.a:.3f}{ci}" if np.isfinite(fit.a) else "no law"
        ax.set_title(f"{config}\n{law}", color=config_color(config))
        if fit.flags:
            ax.text(0.03, 0.04, fit.flags[:60], transform=ax.transAxes, fontsize=6)
        _log_axes(ax)
        ax.set_xlabel("params N")
        ax.set_ylabel(fit.loss.replace("_", " "))
        ax.grid(alpha=0.3, which="both")
    fig.colorbar(
        plt.cm.ScalarMappable(norm=norm, cmap=cmap),
        ax=axes,
        label="compute budget C (FLOPs)",
        shrink=0.7,
    )
    fig.suptitle(
        "IsoFLOP curves: parabola in log N per budget, stars: N_opt(C) (dotted: minimum outside "
        "the sampled N, left out); a in N_opt ∝ C^a with bootstrap 95% CI"
    )
    return save(fig, out_dir, "isoflop")


# The registered plots (analysis.registry): what `sweep analyze --plot` offers.
@plot("scaling", "final validation loss vs compute C per configuration with its fitted L(C)")
def _scaling(src: Source, out_dir: Path) -> list[Path]:
    return plot_scaling(src.runs, src.compute_laws, out_dir)


@plot("contours", "iso-loss contours of the fitted L(N, D) per configuration")
def _contours(src: Source, out_dir: Path) -> list[Path]:
    return plot_contours(src.runs, src.chinchilla_laws, out_dir)


@plot("curves", "train-loss and grad-norm curves per configuration", CURVES)
def _curves(src: Source, out_dir: Path) -> list[Path]:
    if src.curves is None or src.curves.empty:
        raise ValueError(f"plot 'curves' needs step metrics (train/loss) and {src.label} has none")
    return plot_curves(src.curves, out_dir)


@plot(
    "instability",
    "heatmap of the unstable fraction per configuration x budget",
    CURVES,
    page="instability",
)
def _instability(src: Source, out_dir: Path) -> list[Path]:
    return plot_instability(frequency_table(src.classified()), out_dir)


@plot("frontier", "final - best validation loss over (N, D) per configuration")
def _frontier(src: Source, out_dir: Path) -> list[Path]:
    return plot_frontier(src.runs, out_dir)


@plot("isoflop", "loss vs N per budget with the IsoFLOP parabolas and their minima")
def _isoflop(src: Source, out_dir: Path) -> list[Path]:
    return plot_isoflop(src.isoflop_fits, out_dir)
