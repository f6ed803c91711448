"""Loss-to-loss transfer between configurations, and held-out tests of it against other laws.

Shifted power law (Brandfonbrener et al. 2024): L_2(C) = K*(L_1(C) - E_1)^kappa + E_2, with
L_1 the base configuration's loss at compute C and L_2 the target's.

Pairing is by compute budget on each configuration's lower envelope: the best run of a budget,
i.e. the grid's compute-optimal model. Not every shared (N, D) point, because (a) the paper's
table and sweeps with diverged or dropped runs do not share one (N, D) grid, (b) off-optimal
shapes carry an allocation penalty that belongs to the shape, not the precision, and (c) what a
user wants predicted is the best loss a budget buys. One pair per budget also makes the budget
the bootstrap's independent unit.

E_1 and E_2 come from each configuration's own L(C) = E + A*C^-gamma fit on its envelope, both on
the budgets fitted (<= the cut-off). The premise is a full base ladder: the base's observed best
loss at a held-out budget is what the transfer maps onto the target there.
K and kappa are then fitted in log space, log L_2 = logaddexp(log K + kappa*log(L_1 - E_1),
log E_2), with the project's scaled Huber objective (:mod:`analysis.fit`). Intervals come from a
parametric bootstrap: every envelope loss is redrawn with its configuration's residual noise
around its own L(C) and E_1, E_2, K and kappa are refitted on every draw.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.configs import BASELINE, config_order, parse_config
from analysis.fit import (
    ComputeFit,
    FitInfo,
    batch_values,
    bootstrap,
    fit_compute,
    fit_info,
    log_sum_exp,
    make_objective,
    minimize_multistart,
)
from analysis.joint import JointFit, fit_joint
from analysis.laws import N_BOOT, lower_envelope, usable
from analysis.registry import table

if TYPE_CHECKING:
    from analysis.report import Source

LOSS = "final_val_loss"
LOG_K_BOUNDS = (-20.0, 20.0)
KAPPA_BOUNDS = (0.05, 5.0)
_GRID = [np.arange(-4.0, 4.01, 1.0), np.array([0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0])]
_N_STARTS = 8
# Smallest log-space loss noise the bootstrap assumes: a fifth of the paper's losses are given
# to 0.005 only (quantisation sd 0.0014, ~0.2% at L ~ 0.75), and a 4-budget L(C) fit has one
# residual degree of freedom, too few to estimate the noise from.
NOISE_FLOOR = 0.002
# Budgets are 4 significant digits in the paper's table; a planned budget matches an observed one
# within this relative distance.
_BUDGET_RTOL = 1e-2
METHODS = ("transfer", "own", "joint")
_OWN_STARTS = 8


@dataclass(frozen=True, kw_only=True)
class TransferFit(FitInfo):
    """L_2 = K*(L_1 - E_1)^kappa + E_2 between a base and a target configuration."""

    K: float
    kappa: float
    E1: float
    E2: float
    base: str
    target: str
    e_flags: str = ""

    def predict(self, base_loss: np.ndarray) -> np.ndarray:
        """Target loss where the base reaches ``base_loss`` (E_2 where L_1 <= E_1)."""
        gap = np.maximum(np.asarray(base_loss, float) - self.E1, 0.0)
        return self.K * gap**self.kappa + self.E2

    @property
    def wide_ci(self) -> tuple[str, ...]:
        """kappa is the shape parameter here (K trades off against it, like A and B do)."""
        lo, hi = self.ci.get("kappa", (self.kappa, self.kappa))
        return ("kappa",) if hi - lo > abs(self.kappa) else ()

    @property
    def trustworthy(self) -> bool:
        return super().trustworthy and not self.e_flags

    def flags(self) -> str:
        """FitInfo's flags plus those of the own fits E_1 and E_2 come from."""
        return "; ".join(f for f in (super().flags(), self.e_flags) if f)


def _transfer_model(log_e2: float):
    def model(theta: np.ndarray, x: tuple[np.ndarray, ...]):
        k, kappa = theta
        (u,) = x  # log(L_1 - E_1)
        first = k + kappa * u
        pred, w = log_sum_exp(np.stack([first, np.full_like(first, log_e2)]))
        return pred, np.stack([w[0], w[0] * u])

    return model


def fit_k_kappa(
    base_loss,
    target_loss,
    E1: float,
    E2: float,
    *,
    base: str = "base",
    target: str = "target",
    start: np.ndarray | None = None,
    e_flags: str = "",
) -> TransferFit:
    """Fit K and kappa with E_1 and E_2 fixed; pairs where L_1 <= E_1 cannot enter the law."""
    l1, l2 = np.asarray(base_loss, float), np.asarray(target_loss, float)
    keep = l1 > E1
    if keep.sum() < 2 or E2 <= 0:
        raise ValueError(
            f"{target} vs {base}: {int(keep.sum())} budget(s) with L_1 > E_1 = {E1:.4g} "
            f"(E_2 = {E2:.4g}); need 2 to fit K and kappa"
        )
    if not keep.all():
        e_flags = "; ".join(f for f in (e_flags, f"{int((~keep).sum())} pair(s) L_1<=E_1") if f)
    x, log_l2 = (np.log(l1[keep] - E1),), np.log(l2[keep])
    model = _transfer_model(float(np.log(E2)))
    objective = make_objective(model, x, log_l2)
    bounds = [LOG_K_BOUNDS, KAPPA_BOUNDS]
    if start is None:
        starts = np.array(list(itertools.product(*_GRID)))
        values = batch_values(model, x, log_l2, starts)
        res, used = minimize_multistart(objective, starts, bounds, _N_STARTS, values)
    else:
        res, used = minimize_multistart(objective, np.atleast_2d(start), bounds, 1)
    info = fit_info(res, ("K", "kappa"), bounds, int(keep.sum()), used)
    return TransferFit(
        K=float(np.exp(res.x[0])),
        kappa=float(res.x[1]),
        E1=float(E1),
        E2=float(E2),
        base=base,
        target=target,
        e_flags=e_flags,
        **info,
    )


def _own_fit(env: pd.DataFrame, loss: str, start: np.ndarray | None = None) -> ComputeFit:
    # 8 grid starts reach the 32-start optimum on every paper configuration at a quarter of
    # the time (a 4-budget fit is flat and L-BFGS takes ~100 steps from each start).
    n_starts = _OWN_STARTS if start is None else 1
    return fit_compute(env["flops"], env[loss], n_starts=n_starts, start=start)


def noise_sigma(fit: ComputeFit, env: pd.DataFrame, loss: str, floor: float) -> float:
    """Log-space noise of an envelope around its own L(C): residual RMS with the degrees of
    freedom corrected (n - 3), never below ``floor`` (and ``floor`` when n <= 3)."""
    r = np.log(env[loss].to_numpy(float)) - np.log(fit.predict(env["flops"].to_numpy(float)))
    dof = len(r) - fit.n_free
    return max(floor, float(np.sqrt(np.sum(r**2) / dof))) if dof > 0 else floor


def _e_flags(base: ComputeFit, own: ComputeFit) -> str:
    named = (("E_1 (base L(C))", base), ("E_2 (own L(C))", own))
    return "; ".join(f"{name}: {fit.flags()}" for name, fit in named if fit.flags())


@dataclass(frozen=True)
class Transfer:
    """A fitted transfer, the own fits it rests on, and its bootstrap.

    ``samples``: one row per bootstrap draw, columns K, kappa, E1, E2 and the own fit's A, E,
    gamma (None without a bootstrap). ``base_sigma``: the base's log-space noise, also drawn
    onto the base losses a prediction starts from.
    """

    fit: TransferFit
    base_fit: ComputeFit
    own_fit: ComputeFit
    base_env: pd.Series
    samples: np.ndarray | None = field(repr=False)
    base_sigma: float = 0.0
    level: float = 0.95
    seed: int = 0

    def base_loss(self, budgets) -> np.ndarray:
        """The base's best observed loss at each budget, or its own L(C) where it has none."""
        budgets = np.atleast_1d(np.asarray(budgets, float))
        known = self.base_env.index.to_numpy(float)
        out = self.base_fit.predict(budgets)
        for i, c in enumerate(budgets):
            hit = np.flatnonzero(np.abs(known / c - 1) <= _BUDGET_RTOL)
            if len(hit):
                out[i] = self.base_env.iloc[hit[0]]
        return out

    def _quantiles(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = (1 - self.level) / 2
        return np.nanquantile(values, q, axis=0), np.nanquantile(values, 1 - q, axis=0)

    def predict(self, budgets) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Transfer prediction at each budget with its bootstrap interval (nan without one)."""
        l1 = self.base_loss(budgets)
        pred = self.fit.predict(l1)
        if self.samples is None:
            return pred, np.full_like(pred, np.nan), np.full_like(pred, np.nan)
        K, kappa, E1, E2 = (self.samples[:, i, None] for i in range(4))
        # The base's observed loss at a predicted budget is itself one noisy draw.
        noise = np.random.default_rng(self.seed + 1).standard_normal((len(K), len(l1)))
        l1_draws = l1 * np.exp(self.base_sigma * noise)
        lo, hi = self._quantiles(K * np.maximum(l1_draws - E1, 0.0) ** kappa + E2)
        return pred, lo, hi

    def predict_own(self, budgets) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The target's own L(C) extrapolation with its bootstrap interval."""
        c = np.atleast_1d(np.asarray(budgets, float))
        pred = self.own_fit.predict(c)
        if self.samples is None:
            return pred, np.full_like(pred, np.nan), np.full_like(pred, np.nan)
        A, E, gamma = (self.samples[:, i, None] for i in range(4, 7))
        with np.errstate(over="ignore", invalid="ignore"):
            lo, hi = self._quantiles(E + A * c**-gamma)
        return pred, lo, hi


@dataclass(frozen=True)
class BaseLadder:
    """The base configuration's envelope, own L(C), noise and bootstrap draws (shared by every
    target fitted against it). ``env``: the fitted budgets; ``observed``: its best loss at
    every budget (what a prediction starts from)."""

    name: str
    env: pd.DataFrame
    observed: pd.Series
    fit: ComputeFit
    sigma: float
    draws: np.ndarray  # (n_boot, budgets): redrawn envelope losses
    e1_draws: np.ndarray  # (n_boot,): E_1 refitted on each draw


def base_ladder(
    runs: pd.DataFrame,
    base: str,
    *,
    loss: str = LOSS,
    n_boot: int = N_BOOT,
    seed: int = 0,
    noise_floor: float = NOISE_FLOOR,
    cutoff: float | None = None,
) -> BaseLadder:
    """Fit the base's own L(C) on its budgets <= ``cutoff`` (all when None) and redraw it
    ``n_boot`` times. E_1 thus comes from the same budgets as the pairs K and kappa are
    fitted on; the base's losses above the cut-off only enter as inputs to predictions."""
    _require(runs, base)
    full = lower_envelope(runs[runs["config"] == base], loss)
    env = full if cutoff is None else full[full["budget"] <= cutoff * (1 + 1e-9)]
    if len(env) < 2:
        raise ValueError(f"base {base!r}: {len(env)} budget(s) with a finite {loss}; need 2")
    fit = _own_fit(env, loss)
    sigma = noise_sigma(fit, env, loss, noise_floor)
    rng = np.random.default_rng(seed)
    draws = env[loss].to_numpy() * np.exp(sigma * rng.standard_normal((max(n_boot, 0), len(env))))
    e1 = [_own_fit(env.assign(**{loss: d}), loss, np.array(fit.theta)).E for d in draws]
    observed = full.set_index("budget")[loss]
    return BaseLadder(base, env, observed, fit, sigma, draws, np.array(e1))


def _require(runs: pd.DataFrame, name: str) -> None:
    have = set(runs["config"])
    if name not in have:
        raise ValueError(f"configuration {name!r} has no runs; have {config_order(have)}")


def fit_transfer(
    runs: pd.DataFrame,
    base: str | BaseLadder,
    target: str,
    *,
    cutoff: float | None = None,
    loss: str = LOSS,
    n_boot: int = N_BOOT,
    level: float = 0.95,
    seed: int = 0,
    noise_floor: float = NOISE_FLOOR,
) -> Transfer:
    """Fit L_target = K*(L_base - E_1)^kappa + E_2 on budgets <= ``cutoff`` (all when None).

    ``base``: a configuration name, or a :class:`BaseLadder` already fitted (with the same
    ``loss``, ``n_boot``, ``seed``, ``cutoff``) to share between targets. Raises ValueError
    when a configuration has no runs or fewer than 2 budgets pair.
    """
    ladder = (
        base
        if isinstance(base, BaseLadder)
        else base_ladder(
            runs, base, loss=loss, n_boot=n_boot, seed=seed, noise_floor=noise_floor, cutoff=cutoff
        )
    )
    _require(runs, target)
    tgt_runs = runs[runs["config"] == target]
    if cutoff is not None:
        tgt_runs = tgt_runs[tgt_runs["budget"] <= cutoff * (1 + 1e-9)]
    tgt_env = lower_envelope(tgt_runs, loss)
    pairs = tgt_env.merge(ladder.env[["budget", loss]], on="budget", suffixes=("", "_base"))
    if len(pairs) < 2:
        raise ValueError(
            f"{target} vs {ladder.name}: {len(pairs)} shared budget(s) with a finite {loss} "
            f"(cut-off {cutoff}); need 2"
        )
    own = _own_fit(pairs, loss)
    l1, l2 = pairs[f"{loss}_base"].to_numpy(), pairs[loss].to_numpy()
    point = fit_k_kappa(
        l1,
        l2,
        ladder.fit.E,
        own.E,
        base=ladder.name,
        target=target,
        e_flags=_e_flags(ladder.fit, own),
    )
    sigma = noise_sigma(own, pairs, loss, noise_floor)
    samples = _bootstrap(point, own, ladder, pairs, loss, sigma, seed)
    if samples is not None:
        q = (1 - level) / 2
        ci = {
            name: (float(np.nanquantile(col, q)), float(np.nanquantile(col, 1 - q)))
            for name, col in zip(("K", "kappa", "E1", "E2"), samples[:, :4].T, strict=True)
        }
        point = replace(point, ci=ci)
    return Transfer(point, ladder.fit, own, ladder.observed, samples, ladder.sigma, level, seed)


def _bootstrap(
    point: TransferFit,
    own: ComputeFit,
    ladder: BaseLadder,
    pairs: pd.DataFrame,
    loss: str,
    sigma: float,
    seed: int,
) -> np.ndarray | None:
    """Redraw every target envelope loss with its estimated noise (the base's draws come with
    the ladder) and refit E_2, K and kappa on each draw.

    A parametric bootstrap rather than resampling budgets: with 4-6 budgets most case
    resamples keep fewer distinct budgets than the own L(C) fit has parameters.
    """
    if len(ladder.draws) < 2:
        return None
    rng = np.random.default_rng(seed + 2)
    at_pairs = pd.Index(ladder.env["budget"]).get_indexer(pairs["budget"])
    rows = []
    for l1, e1 in zip(ladder.draws[:, at_pairs], ladder.e1_draws, strict=True):
        l2 = pairs[loss].to_numpy() * np.exp(sigma * rng.standard_normal(len(pairs)))
        own_b = _own_fit(pairs.assign(**{loss: l2}), loss, np.array(own.theta))
        try:
            tf = fit_k_kappa(l1, l2, e1, own_b.E, start=point.theta)
        except ValueError:  # this draw's E_1 sits above its pairs: no law to fit
            rows.append([np.nan] * 4 + [own_b.A, own_b.E, own_b.gamma])
            continue
        rows.append([tf.K, tf.kappa, tf.E1, tf.E2, own_b.A, own_b.E, own_b.gamma])
    return np.array(rows)


def default_cutoff(runs: pd.DataFrame) -> float:
    """The lower median of the distinct budgets (half fitted, half held out)."""
    budgets = np.sort(runs["budget"].dropna().unique())
    if len(budgets) < 3:
        raise ValueError(
            f"held-out evaluation needs at least 3 budgets; have {len(budgets)}: {budgets}"
        )
    return float(budgets[(len(budgets) - 1) // 2])


@dataclass(frozen=True)
class HeldOut:
    """The held-out table plus the fits behind it (per target) and the joint law."""

    table: pd.DataFrame
    transfers: dict[str, Transfer]
    skipped: dict[str, str]
    joint: JointFit | None
    base: str
    cutoff: float


def _joint_min(joint: JointFit | None, runs: pd.DataFrame, config: str) -> float:
    """The joint law's loss of the best of the (N, D) points run at one budget."""
    if joint is None or config not in joint.efficiency or runs.empty:
        return np.nan
    return float(np.min(joint.predict(runs["n_params"], runs["tokens"], [config] * len(runs))))


def evaluate(
    runs: pd.DataFrame,
    base: str = BASELINE,
    cutoff: float | None = None,
    *,
    loss: str = LOSS,
    n_boot: int = N_BOOT,
    level: float = 0.95,
    seed: int = 0,
    joint: bool = True,
) -> HeldOut:
    """Fit on budgets <= cutoff, predict every budget above.

    The three methods see the same data: the base ladder in full (its losses above the cut-off
    only as inputs to the transfer; the joint law fits them), every other configuration up to
    the cut-off. ``joint=False`` skips the joint law (its fit dominates the run time).
    """
    _require(runs, base)
    cutoff = default_cutoff(runs) if cutoff is None else float(cutoff)
    above = runs["budget"] > cutoff * (1 + 1e-9)
    if not above.any() or above.all():
        raise ValueError(
            f"cutoff {cutoff:.4g} leaves no budget on one side; budgets: "
            f"{', '.join(f'{b:.4g}' for b in sorted(runs['budget'].dropna().unique()))}"
        )
    ladder = base_ladder(runs, base, loss=loss, n_boot=n_boot, seed=seed, cutoff=cutoff)
    train = runs[~above | (runs["config"] == base)]
    joint_fit = fit_joint(train, loss) if joint else None
    rows, transfers, skipped = [], {}, {}
    for config in config_order(set(runs["config"]) - {base}):
        try:
            tr = fit_transfer(
                runs, ladder, config, cutoff=cutoff, loss=loss, level=level, seed=seed
            )
        except ValueError as err:
            skipped[config] = str(err)
            continue
        transfers[config] = tr
        test = runs[(runs["config"] == config) & above]
        budgets = np.sort(test["budget"].unique())
        pred, lo, hi = tr.predict(budgets)
        own, own_lo, own_hi = tr.predict_own(budgets)
        base_loss = tr.base_loss(budgets)
        for i, budget in enumerate(budgets):
            at = test[test["budget"] == budget]
            ok = usable(at, loss)
            observed = float(ok[loss].min()) if len(ok) else np.nan
            rows.append(
                {
                    "config": config,
                    "budget": float(budget),
                    "observed": observed,
                    "transfer": pred[i],
                    "transfer_lo": lo[i],
                    "transfer_hi": hi[i],
                    "own": own[i],
                    "own_lo": own_lo[i],
                    "own_hi": own_hi[i],
                    "joint": _joint_min(joint_fit, ok, config),
                    # Every run of the budget diverged: the loss left every interval.
                    "departed": bool(observed > hi[i]) if len(ok) else True,
                    "base_loss": base_loss[i],
                    "n_runs": len(at),
                    "n_fit_budgets": tr.fit.n_points,
                    "flags": tr.fit.flags(),
                }
            )
    table = pd.DataFrame(rows, columns=_COLUMNS)
    for method in METHODS:
        err = table[method] - table["observed"]
        table[f"{method}_abs_err"] = err.abs()
        table[f"{method}_rel_err"] = (err / table["observed"]).abs()
    return HeldOut(table, transfers, skipped, joint_fit, base, cutoff)


_COLUMNS = [
    "config",
    "budget",
    "observed",
    "transfer",
    "transfer_lo",
    "transfer_hi",
    "own",
    "own_lo",
    "own_hi",
    "joint",
    "departed",
    "base_loss",
    "n_runs",
    "n_fit_budgets",
    "flags",
]


def held_out(
    runs: pd.DataFrame,
    base: str = BASELINE,
    cutoff: float | None = None,
    *,
    loss: str = LOSS,
    n_boot: int = N_BOOT,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per (configuration other than ``base``, budget above ``cutoff``).

    Columns: config, budget, observed (lowest loss at that budget), transfer, transfer_lo,
    transfer_hi, own (the target's own L(C) extrapolation) with own_lo/own_hi, joint (the joint
    precision law at the best of that budget's (N, D) points), departed (observed above
    transfer_hi), base_loss, <method>_abs_err and <method>_rel_err, flags.
    """
    return evaluate(runs, base, cutoff, loss=loss, n_boot=n_boot, level=level, seed=seed).table


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per method and group (all, stable = not fully MX, fully MX): mean/median/max relative
    error, how often it is the closest of the three, how often observed is inside its interval."""
    ok = table.dropna(subset=["observed"])
    fully = ok["config"].map(_fully_mx).to_numpy(bool)
    rows = []
    for group, mask in (("all", np.ones(len(ok), bool)), ("stable", ~fully), ("fully MX", fully)):
        part = ok[mask]
        errors = part[[f"{m}_rel_err" for m in METHODS]].to_numpy(float)
        best = np.argmin(np.where(np.isnan(errors), np.inf, errors), axis=1) if len(part) else []
        for i, method in enumerate(METHODS):
            rel = part[f"{method}_rel_err"]
            row = {
                "group": group,
                "method": method,
                "n": int(rel.notna().sum()),
                "mean_rel_err": rel.mean(),
                "median_rel_err": rel.median(),
                "max_rel_err": rel.max(),
                "mean_abs_err": part[f"{method}_abs_err"].mean(),
                "closest": int(np.sum(np.asarray(best) == i)),
                "in_interval": np.nan,
            }
            if method in ("transfer", "own"):
                obs = part["observed"]
                row["in_interval"] = int(
                    ((obs >= part[f"{method}_lo"]) & (obs <= part[f"{method}_hi"])).sum()
                )
            rows.append(row)
    return pd.DataFrame(rows)


def _fully_mx(config: str) -> bool:
    try:
        return parse_config(config).fully_mx
    except ValueError:  # a sweep's free-form name: not one of the paper's groups
        return False


def departures(table: pd.DataFrame) -> pd.DataFrame:
    """Per configuration: the first held-out budget whose observed loss exceeds transfer_hi."""
    rows = []
    for config, g in table.groupby("config", sort=False):
        hit = g[g["departed"]].sort_values("budget")
        first = hit.iloc[0] if len(hit) else None
        rows.append(
            {
                "config": config,
                "held_out": len(g),
                "departed": len(hit),
                "first_departed_budget": np.nan if first is None else first["budget"],
                "observed_at_first": np.nan if first is None else first["observed"],
                "transfer_hi_at_first": np.nan if first is None else first["transfer_hi"],
            }
        )
    return pd.DataFrame(rows)


def fits_table(result: HeldOut) -> pd.DataFrame:
    """K, kappa, E_1, E_2 with bootstrap CIs and flags, one row per target configuration."""
    rows = []
    for config, tr in result.transfers.items():
        f = tr.fit
        row: dict[str, object] = {"config": config, "base": f.base, "n_pairs": f.n_points}
        for name in ("K", "kappa", "E1", "E2"):
            lo, hi = f.ci.get(name, (np.nan, np.nan))
            row[name] = f"{getattr(f, name):.4g} [{lo:.3g}, {hi:.3g}]"
        row.update(converged=f.converged, trustworthy=f.trustworthy, flags=f.flags())
        rows.append(row)
    rows += [{"config": c, "base": result.base, "flags": why} for c, why in result.skipped.items()]
    return pd.DataFrame(rows)


def predict_planned(
    runs: pd.DataFrame,
    planned: pd.DataFrame,
    base: str = BASELINE,
    *,
    loss: str = LOSS,
    n_boot: int = N_BOOT,
    level: float = 0.95,
) -> pd.DataFrame:
    """Predicted best loss at each planned row's compute (columns ``config``, ``C``: the
    grid's budget where it has one, so the base's observed loss there can be used).

    A configuration with runs of its own and 2+ budgets shared with ``base`` is predicted by
    transfer from the base; the base itself (or a configuration that cannot pair) by its own
    L(C); one absent from ``runs`` is not predicted. All of the source's budgets are fitted.
    Returns predicted, predicted_lo, predicted_hi, method and flags aligned with ``planned``.
    """
    have = set(runs["config"])
    ladder = base_ladder(runs, base, loss=loss, n_boot=n_boot) if base in have else None
    out = pd.DataFrame(
        {"predicted": np.nan, "predicted_lo": np.nan, "predicted_hi": np.nan},
        index=planned.index,
    )
    out["method"], out["flags"] = "none", ""
    for config, idx in planned.groupby("config", sort=False).groups.items():
        method, predictor, flags = _predictor(runs, config, ladder, loss, n_boot, level)
        out.loc[idx, "method"], out.loc[idx, "flags"] = method, flags
        if predictor is not None:
            # Predict each distinct compute once so a run's interval does not depend on
            # which other runs are planned (the bootstrap draws are per call).
            c = planned.loc[idx, "C"].to_numpy(float)
            unique, where = np.unique(c, return_inverse=True)
            pred, lo, hi = predictor(unique)
            out.loc[idx, "predicted"], out.loc[idx, "predicted_lo"] = pred[where], lo[where]
            out.loc[idx, "predicted_hi"] = hi[where]
    return out


def _predictor(runs, config, ladder, loss, n_boot, level):
    """(method, callable C -> (pred, lo, hi) or None, flags) for one configuration."""
    if config not in set(runs["config"]):
        return "none", None, f"no runs of {config} in the source"
    if ladder is not None and config != ladder.name:
        try:
            tr = fit_transfer(runs, ladder, config, loss=loss, level=level)
        except ValueError:
            pass  # falls back on the configuration's own law below
        else:
            return f"transfer from {ladder.name}", tr.predict, tr.fit.flags()
    env = lower_envelope(runs[runs["config"] == config], loss)
    if len(env) < 2:
        return "none", None, f"{len(env)} budget(s) of {config}: no fit"
    own = _own_fit(env, loss)
    boot = None
    if len(env) > own.n_free and n_boot >= 2:
        boot = bootstrap(
            own, (env["flops"].to_numpy(),), env[loss].to_numpy(), n_boot=n_boot, workers=1
        )

    def predict(c: np.ndarray):
        lo, hi = boot.loss_ci(c) if boot else (np.full_like(c, np.nan),) * 2
        return own.predict(c), lo, hi

    return "own L(C)", predict, own.flags()


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def headline(result: HeldOut) -> str:
    """One sentence with the held-out numbers (the README quotes it; a test keeps them equal)."""
    stats = summary(result.table).set_index(["group", "method"])
    n = int(stats.loc[("all", "transfer"), "n"])

    def errors(group: str) -> str:
        return ", ".join(f"{m} {_pct(stats.loc[(group, m), 'mean_rel_err'])}" for m in METHODS)

    closest = ", ".join(f"{m} {int(stats.loc[('all', m), 'closest'])}" for m in METHODS)
    dep = departures(result.table).dropna(subset=["first_departed_budget"])
    firsts = "; ".join(
        f"{row.config} at {row.first_departed_budget:.3g}" for row in dep.itertuples(index=False)
    )
    return (
        f"Cut-off {result.cutoff:.3g} ({n} held-out predictions): mean |relative error| "
        f"{errors('all')} (stable configurations: {errors('stable')}; fully MX: "
        f"{errors('fully MX')}); closest of the three: {closest}; the observed loss leaves the "
        f"transfer interval in {int(result.table['departed'].sum())} of {n}, first at "
        f"{firsts or 'no budget'}."
    )


@table("transfer", "held-out predictions vs --base: transfer, own L(C) and joint law (--cutoff)")
def _tables(src: Source, out_dir: Path) -> list[Path]:
    from analysis.tables import write_table

    result = src.held_out
    cut = f"budgets <= {result.cutoff:.3g}"
    note = (
        f"Fitted on {cut}; every budget above is predicted ({result.base}'s observed loss "
        "there is the transfer's input). "
        "observed: lowest final val loss at the budget; transfer: "
        f"K(L_{result.base} - E_1)^kappa + E_2 with its 95% bootstrap CI; own: the "
        "configuration's own L(C); joint: the joint precision law at the best of the budget's "
        "(N, D) points; departed: observed above transfer_hi."
    )
    paths = write_table(
        result.table, out_dir, "transfer", f"Held-out predictions vs {result.base}", note
    )
    paths += write_table(
        summary(result.table),
        out_dir,
        "transfer_summary",
        f"Held-out relative error per method ({cut})",
        "closest: rows where the method is nearest the observed loss; in_interval: observed "
        "inside the method's 95% interval. fully MX: MX weights and activations, both passes.",
    )
    paths += write_table(
        departures(result.table),
        out_dir,
        "transfer_departures",
        "First held-out budget where the observed loss exceeds the transfer interval",
    )
    return paths + write_table(
        fits_table(result),
        out_dir,
        "transfer_fits",
        f"Transfer fits L = K(L_{result.base} - E_1)^kappa + E_2 ({cut}; 95% bootstrap CI)",
    )
