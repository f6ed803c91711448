"""Scaling laws fitted per configuration on a tidy run frame (shared by tables and figures)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.configs import config_order
from analysis.fit import (
    KAPLAN_STARTS,
    Bootstrap,
    ComputeFit,
    NDFit,
    bootstrap,
    fit_chinchilla,
    fit_compute,
    fit_kaplan,
)

N_BOOT = 100


def usable(runs: pd.DataFrame, loss: str) -> pd.DataFrame:
    """Runs with a finite, positive loss and positive N, D, C (diverged runs drop out)."""
    cols = runs[[loss, "n_params", "tokens", "flops"]].astype(float)
    ok = np.isfinite(cols).all(axis=1) & (cols > 0).all(axis=1)
    return runs[ok.to_numpy()]


def lower_envelope(runs: pd.DataFrame, loss: str) -> pd.DataFrame:
    """The best (lowest-loss) usable run of each compute budget, sorted by budget."""
    ok = usable(runs, loss)
    if ok.empty:
        return ok
    return ok.loc[ok.groupby("budget")[loss].idxmin()].sort_values("budget")


@dataclass(frozen=True)
class ConfigLaw:
    """A fitted law of one configuration: the fit, its bootstrap (if any) and its data."""

    config: str
    fit: NDFit | ComputeFit | None
    boot: Bootstrap | None
    data: pd.DataFrame
    reason: str = ""

    @property
    def drawable(self) -> bool:
        """Draw as a law only when it converged inside bounds and the CI pins it down."""
        return self.fit is not None and self.fit.trustworthy

    @property
    def label_note(self) -> str:
        if self.fit is None:
            return self.reason
        return self.fit.flags()


def _boot_or_none(fit, x, y, n_boot: int, workers: int | None) -> Bootstrap | None:
    # Resampling cannot say anything when the points determine the law exactly.
    if n_boot < 2 or len(np.unique(np.column_stack(x), axis=0)) <= fit.n_free:
        return None
    return bootstrap(fit, x, y, n_boot=n_boot, workers=workers)


def compute_laws(
    runs: pd.DataFrame,
    loss: str = "final_val_loss",
    n_boot: int = N_BOOT,
    workers: int | None = None,
) -> list[ConfigLaw]:
    """L(C) = E + A*C^-gamma per configuration, on its lower envelope (best run per budget)."""
    laws = []
    for config in config_order(set(runs["config"])):
        env = lower_envelope(runs[runs["config"] == config], loss)
        if len(env) < 2:
            laws.append(ConfigLaw(config, None, None, env, f"{len(env)} budget(s): no fit"))
            continue
        fit = fit_compute(env["flops"], env[loss])
        boot = _boot_or_none(fit, (env["flops"].to_numpy(),), env[loss].to_numpy(), n_boot, workers)
        laws.append(ConfigLaw(config, boot.fit if boot else fit, boot, env))
    return laws


def chinchilla_laws(
    runs: pd.DataFrame,
    loss: str = "min_val_loss",
    n_boot: int = N_BOOT,
    workers: int | None = None,
    n_starts: int = 100,
) -> list[ConfigLaw]:
    """L(N, D) per configuration on all its usable runs (needs >= 3 sizes and 3 budgets)."""
    return _nd_laws(fit_chinchilla, runs, loss, n_boot, workers, n_starts)


def kaplan_laws(
    runs: pd.DataFrame,
    loss: str = "min_val_loss",
    n_boot: int = N_BOOT,
    workers: int | None = None,
    n_starts: int = KAPLAN_STARTS,
) -> list[ConfigLaw]:
    """The Kaplan form of L(N, D) per configuration, on the runs Chinchilla laws use."""
    return _nd_laws(fit_kaplan, runs, loss, n_boot, workers, n_starts)


def _nd_laws(
    fitter: Callable[..., NDFit],
    runs: pd.DataFrame,
    loss: str,
    n_boot: int,
    workers: int | None,
    n_starts: int,
) -> list[ConfigLaw]:
    laws = []
    for config in config_order(set(runs["config"])):
        ok = usable(runs[runs["config"] == config], loss)
        if ok["n_params"].nunique() < 3 or ok["tokens"].nunique() < 3:
            laws.append(ConfigLaw(config, None, None, ok, "fewer than 3 sizes or token counts"))
            continue
        fit = fitter(ok["n_params"], ok["tokens"], ok[loss], n_starts=n_starts)
        x = (ok["n_params"].to_numpy(), ok["tokens"].to_numpy())
        boot = _boot_or_none(fit, x, ok[loss].to_numpy(), n_boot, workers)
        laws.append(ConfigLaw(config, boot.fit if boot else fit, boot, ok))
    return laws
