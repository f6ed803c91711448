"""IsoFLOP fits (Hoffmann et al. approach 2): a parabola of loss vs log N per compute budget,
its minimum N_opt(C), then N_opt = k·C^a across budgets.

A budget counts only when its parabola opens upwards and its minimum lies inside the sampled
N range; otherwise the minimum is an extrapolation and the budget is flagged and left out.
The CI on a comes from resampling runs within each budget and repeating the whole procedure
(parabolas, the same flag rule, the line), vectorised over resamples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.configs import config_order
from analysis.laws import usable

MIN_SIZES = 3
N_BOOT = 1000
LEVEL = 0.95

_COLUMNS = (
    "budget",
    "n_sizes",
    "n_runs",
    "n_lo",
    "n_hi",
    "n_opt",
    "d_opt",
    "loss_opt",
    "c0",
    "c1",
    "c2",
    "flag",
    "used",
)


@dataclass(frozen=True)
class IsoFlopFit:
    """N_opt = k·C^a from per-budget parabolas; ``budgets`` has one row per compute budget.

    ``budgets`` columns: budget, n_sizes, n_runs, n_lo, n_hi (sampled N range), n_opt, d_opt,
    loss_opt, c0, c1, c2 (loss = c0 + c1·log N + c2·log² N), flag ('' when used), used.
    ``flags`` says why not to trust the law ('' when none); ``ci`` is the bootstrap CI on a.
    """

    a: float
    k: float
    ci: tuple[float, float] | None
    flags: str
    budgets: pd.DataFrame
    data: pd.DataFrame = field(repr=False)
    loss: str = "min_val_loss"

    @property
    def trustworthy(self) -> bool:
        return not self.flags

    @property
    def n_used(self) -> int:
        return int(self.budgets["used"].sum())

    def n_opt(self, C: np.ndarray) -> np.ndarray:
        """Compute-optimal parameters k·C^a."""
        return self.k * np.asarray(C, float) ** self.a

    def d_opt(self, C: np.ndarray) -> np.ndarray:
        """Compute-optimal tokens C/(6·N_opt)."""
        return np.asarray(C, float) / (6.0 * self.n_opt(C))

    def parabola(self, budget: float, N: np.ndarray) -> np.ndarray:
        """The fitted loss of ``budget``'s parabola at N."""
        row = self.budgets.set_index("budget").loc[budget]
        x = np.log(np.asarray(N, float))
        return row["c0"] + row["c1"] * x + row["c2"] * x**2


def _parabolas(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
    """Least-squares y = c0 + c1·x + c2·x² for each row of x, y (R, n), via the normal equations.

    Returns c0, c1, c2 and whether the row has a unique fit (>= 3 distinct x).
    """
    distinct = 1 + (np.diff(np.sort(x, axis=1), axis=1) > 0).sum(axis=1)
    ok = distinct >= MIN_SIZES
    s = [np.sum(x**p, axis=1) for p in range(5)]
    t = [np.sum(x**p * y, axis=1) for p in range(3)]
    m = np.stack([np.stack(s[i : i + 3], axis=-1) for i in range(3)], axis=-2)
    m[~ok] = np.eye(3)  # keeps the batched solve defined; these rows are discarded
    c = np.linalg.solve(m, np.stack(t, axis=-1)[..., None])[..., 0]
    return c[:, 0], c[:, 1], c[:, 2], ok


def _vertices(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, ...]:
    """Parabola minima of each row: (x_min, coefficients, usable, flag code).

    x is centred per row before fitting so x² terms stay well conditioned; coefficients are
    returned for the uncentred x. Flag codes: 0 ok, 1 < 3 sizes, 2 no minimum, 3 below, 4 above.
    """
    centre = x.mean(axis=1, keepdims=True)
    c0, c1, c2, unique = _parabolas(x - centre, y)
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex = -c1 / (2 * c2)
    lo, hi = x.min(axis=1), x.max(axis=1)
    m = centre[:, 0]
    code = np.select(
        [~unique, ~(c2 > 0), vertex + m < lo, vertex + m > hi], [1, 2, 3, 4], default=0
    )
    coefs = (c0 - c1 * m + c2 * m**2, c1 - 2 * c2 * m, c2)
    return vertex + m, coefs, code == 0, code


def _slopes(log_c: np.ndarray, log_n: np.ndarray, used: np.ndarray) -> tuple[np.ndarray, ...]:
    """Least-squares log N = log k + a·log C over the used budgets of each row (R, B)."""
    w = used.astype(float)
    x = np.broadcast_to(log_c, w.shape)
    y = np.where(used, log_n, 0.0)
    sw, sx, sy = w.sum(1), (w * x).sum(1), (w * y).sum(1)
    sxx, sxy = (w * x * x).sum(1), (w * x * y).sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = (sw * sxy - sx * sy) / (sw * sxx - sx**2)
        log_k = (sy - a * sx) / sw
    enough = sw >= 2
    return np.where(enough, a, np.nan), np.where(enough, log_k, np.nan)


_FLAGS = {1: f"fewer than {MIN_SIZES} sizes", 2: "no minimum (concave)"}


def _flag(code: int, n_lo: float, n_hi: float) -> str:
    if code == 3:
        return f"minimum below sampled N ({n_lo:.3g})"
    if code == 4:
        return f"minimum above sampled N ({n_hi:.3g})"
    return _FLAGS.get(code, "")


def fit_isoflop(
    frame: pd.DataFrame,
    loss: str = "min_val_loss",
    *,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    seed: int = 0,
) -> IsoFlopFit:
    """IsoFLOP fit of one configuration's runs (columns budget, n_params, ``loss``).

    Diverged runs (no finite loss) drop out. a and k are NaN when fewer than 2 budgets have
    an interior minimum; ``flags`` then says so.
    """
    ok = usable(frame, loss).sort_values(["budget", "n_params"])
    groups = [(float(b), g) for b, g in ok.groupby("budget", sort=True)]
    rng = np.random.default_rng(seed)
    rows, boot_log_n, boot_used = [], [], []
    for budget, g in groups:
        x, y = np.log(g["n_params"].to_numpy(float)), g[loss].to_numpy(float)
        (log_n,), (c0, c1, c2), (used,), (code,) = _vertices(x[None], y[None])
        n_opt = float(np.exp(log_n)) if used else np.nan
        n_lo, n_hi = float(np.exp(x.min())), float(np.exp(x.max()))
        rows.append(
            {
                "budget": budget,
                "n_sizes": len(np.unique(x)),
                "n_runs": len(x),
                "n_lo": n_lo,
                "n_hi": n_hi,
                "n_opt": n_opt,
                "d_opt": budget / (6 * n_opt),
                "loss_opt": float(c0[0] + c1[0] * log_n + c2[0] * log_n**2) if used else np.nan,
                "c0": float(c0[0]),
                "c1": float(c1[0]),
                "c2": float(c2[0]),
                "flag": _flag(int(code), n_lo, n_hi),
                "used": bool(used),
            }
        )
        if n_boot >= 2:
            idx = rng.integers(0, len(x), (n_boot, len(x)))
            b_log_n, _, b_used, _ = _vertices(x[idx], y[idx])
            boot_log_n.append(b_log_n)
            boot_used.append(b_used)
    budgets = pd.DataFrame(rows, columns=list(_COLUMNS))
    log_c = np.log(budgets["budget"].to_numpy(float))
    used = budgets["used"].to_numpy(bool)
    (a,), (log_k,) = _slopes(log_c, np.log(budgets["n_opt"].to_numpy(float))[None], used[None])
    ci, flags = None, []
    if used.sum() < 2:
        flags.append(f"{used.sum()} budget(s) with an interior minimum: no fit")
    elif used.sum() == 2:
        flags.append("under-determined (2 budgets)")
    if boot_log_n and np.isfinite(a):
        slopes = _slopes(log_c, np.column_stack(boot_log_n), np.column_stack(boot_used))[0]
        slopes = slopes[np.isfinite(slopes)]
        # With ~3 runs per budget most resamples repeat a size and lose that budget; the few
        # that remain are near-copies of the data and would give a falsely narrow CI.
        if len(slopes) >= n_boot / 2:
            q = (1 - level) / 2
            ci = (float(np.quantile(slopes, q)), float(np.quantile(slopes, 1 - q)))
        else:
            flags.append("no bootstrap CI: too few runs per budget to resample")
    if ci is not None:
        if ci[1] - ci[0] > abs(a):
            flags.append("CI wider than value: a")
        if not ci[0] <= a <= ci[1]:
            # Resamples that keep other budgets disagree with the fit: it hinges on a few runs.
            flags.append("estimate outside its bootstrap CI")
    return IsoFlopFit(
        a=float(a),
        k=float(np.exp(log_k)),
        ci=ci,
        flags="; ".join(flags),
        budgets=budgets,
        data=ok,
        loss=loss,
    )


def isoflop_fits(
    runs: pd.DataFrame, loss: str = "min_val_loss", n_boot: int = N_BOOT
) -> dict[str, IsoFlopFit]:
    """One IsoFLOP fit per configuration, in the figures' configuration order."""
    return {
        config: fit_isoflop(runs[runs["config"] == config], loss, n_boot=n_boot)
        for config in config_order(set(runs["config"]))
    }
