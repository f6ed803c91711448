"""One precision-aware law across configurations, and which form extrapolates better.

Joint law (Kumar et al. 2024 style): L = E + A/(N*f_c)^alpha + B/D^beta with shared
A, B, E, alpha, beta and one effective-parameter factor f_c per configuration (f = 1 for the
reference, bf16_bf16 when present). 5 + K - 1 parameters instead of 5K.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.configs import BASELINE, config_order
from analysis.fit import (
    DELTA,
    EXPONENT_BOUNDS,
    LOG_COEF_BOUNDS,
    LOG_E_BOUNDS,
    SCALE,
    FitInfo,
    fit_chinchilla,
    fit_info,
    log_sum_exp,
    make_objective,
    minimize_multistart,
)
from analysis.laws import usable

LOG_EFF_BOUNDS = (-6.0, 2.0)
_GRID = [
    np.arange(0, 26, 5.0),
    np.arange(0, 26, 5.0),
    np.array([-1.0, 0.0, 1.0]),
    np.array([0.25, 0.5, 1.0]),
    np.array([0.25, 0.5, 1.0]),
]


@dataclass(frozen=True, kw_only=True)
class JointFit(FitInfo):
    """Shared Chinchilla parameters plus per-configuration effective-parameter factors."""

    A: float
    B: float
    E: float
    alpha: float
    beta: float
    efficiency: dict[str, float]
    reference: str

    def predict(self, N, D, configs) -> np.ndarray:
        eff = np.array([self.efficiency[c] for c in configs])
        N, D = np.asarray(N, float), np.asarray(D, float)
        return self.E + self.A / (N * eff) ** self.alpha + self.B / D**self.beta


def _joint_model(index: np.ndarray, k: int):
    def model(theta: np.ndarray, x: tuple[np.ndarray, ...]):
        a, b, e, alpha, beta = theta[:5]
        log_eff = np.concatenate([[0.0], theta[5:]])[index]
        log_n, log_d = x
        z = np.stack([a - alpha * (log_n + log_eff), b - beta * log_d, np.full_like(log_n, e)])
        pred, w = log_sum_exp(z)
        onehot = index[None, :] == np.arange(1, k)[:, None]
        jac = np.vstack(
            [w[0], w[1], w[2], -w[0] * (log_n + log_eff), -w[1] * log_d, -alpha * w[0] * onehot]
        )
        return pred, jac

    return model


def fit_joint(
    runs: pd.DataFrame,
    loss: str = "min_val_loss",
    *,
    n_starts: int = 32,
    start: np.ndarray | None = None,
) -> JointFit:
    """Fit the joint precision-aware law on every usable run of every configuration."""
    ok = usable(runs, loss)
    configs = config_order(set(ok["config"]))
    if not configs:
        raise ValueError(f"no runs with a finite {loss} to fit a joint law")
    reference = BASELINE if BASELINE in configs else configs[0]
    configs = [reference] + [c for c in configs if c != reference]
    index = ok["config"].map({c: i for i, c in enumerate(configs)}).to_numpy()
    k = len(configs)
    objective = make_objective(
        _joint_model(index, k),
        (np.log(ok["n_params"].to_numpy(float)), np.log(ok["tokens"].to_numpy(float))),
        np.log(ok[loss].to_numpy(float)),
        delta=DELTA,
        scale=SCALE,
    )
    bounds = [LOG_COEF_BOUNDS, LOG_COEF_BOUNDS, LOG_E_BOUNDS, EXPONENT_BOUNDS, EXPONENT_BOUNDS]
    bounds += [LOG_EFF_BOUNDS] * (k - 1)
    if start is None:
        starts = np.array([[*s, *[0.0] * (k - 1)] for s in itertools.product(*_GRID)])
    else:
        starts = np.atleast_2d(start)
    res, used = minimize_multistart(objective, starts, bounds, n_starts)
    names = ["A", "B", "E", "alpha", "beta", *(f"f[{c}]" for c in configs[1:])]
    a, b, e, alpha, beta = res.x[:5]
    return JointFit(
        A=float(np.exp(a)),
        B=float(np.exp(b)),
        E=float(np.exp(e)),
        alpha=float(alpha),
        beta=float(beta),
        efficiency=dict(
            zip(configs, np.exp(np.concatenate([[0.0], res.x[5:]])).tolist(), strict=True)
        ),
        reference=reference,
        **fit_info(res, names, bounds, len(ok), used),
    )


def leave_one_budget_out(runs: pd.DataFrame, loss: str = "min_val_loss") -> pd.DataFrame:
    """Hold out each budget, fit per-configuration Chinchilla laws and the joint law on the rest,
    and report each form's mean absolute relative error on the held-out runs.

    Refits start from the all-data estimate (as the bootstrap does) to stay cheap.
    """
    ok = usable(runs, loss)
    full_joint = fit_joint(ok, loss)
    per_config = {
        c: fit_chinchilla(g["n_params"], g["tokens"], g[loss], n_starts=20)
        for c, g in ok.groupby("config")
        if g["n_params"].nunique() >= 3
    }
    # A configuration needs enough runs left after the hold-out to refit its own law.
    enough = ok.groupby(["config", "budget"]).size().unstack(fill_value=0)
    rows = []
    for budget in sorted(ok["budget"].unique()):
        train, test = ok[ok["budget"] != budget], ok[ok["budget"] == budget]
        joint = fit_joint(train, loss, start=np.array(full_joint.theta))
        left = enough.drop(columns=budget).sum(axis=1)
        fittable = [c for c in per_config if left.get(c, 0) >= 6]
        test = test[test["config"].isin(fittable)]
        if test.empty:
            continue
        truth = test[loss].to_numpy()
        pred_joint = joint.predict(test["n_params"], test["tokens"], test["config"])
        pred_sep = np.empty(len(test))
        for config, idx in test.groupby("config").indices.items():
            g = train[train["config"] == config]
            fit = fit_chinchilla(
                g["n_params"],
                g["tokens"],
                g[loss],
                n_starts=1,
                start=np.array(per_config[config].theta),
            )
            pred_sep[idx] = fit.predict(
                test["n_params"].to_numpy()[idx], test["tokens"].to_numpy()[idx]
            )
        for form, pred in (
            ("per-config chinchilla", pred_sep),
            ("joint precision-aware", pred_joint),
        ):
            rows.append(
                {
                    "held_out_budget": budget,
                    "form": form,
                    "n_test": len(test),
                    "mean_abs_rel_error": float(np.mean(np.abs(pred / truth - 1))),
                }
            )
    return pd.DataFrame(rows)
