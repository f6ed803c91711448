"""IsoFLOP fits (approach 2) recover the allocation exponent a known law implies."""

import numpy as np
import pandas as pd
import pytest

from analysis.fit import ChinchillaFit
from analysis.isoflop import fit_isoflop
from analysis.laws import chinchilla_laws
from analysis.report import analyze
from analysis.synthetic import write_synthetic_sweep
from analysis.tables import isoflop_table

# Hoffmann et al.'s law: N_opt ∝ C^(beta/(alpha+beta)) = C^0.4516.
LAW = ChinchillaFit(
    E=1.69,
    A=406.4,
    B=410.7,
    alpha=0.34,
    beta=0.28,
    objective=0.0,
    converged=True,
    grad_norm=0.0,
    n_points=0,
    n_starts=0,
    at_bounds=(),
    message="",
    theta=(),
)
TRUE_A = 0.28 / (0.34 + 0.28)
BUDGETS = np.geomspace(1e18, 1e22, 5)


def isoflop_frame(sizes_of, budgets=BUDGETS, noise: float = 0.0, seed: int = 0) -> pd.DataFrame:
    """Runs on (C, N) grid points with losses from LAW (times log-normal noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    for C in budgets:
        for n in sizes_of(C):
            loss = float(LAW.predict(n, C / (6 * n))) * np.exp(rng.normal(0, noise))
            rows.append(
                {"config": "bf16_bf16", "budget": C, "flops": C, "n_params": n}
                | {"tokens": C / (6 * n), "min_val_loss": loss}
            )
    return pd.DataFrame(rows)


def test_recovers_exponent_of_known_law_exactly_without_noise():
    # Sizes at fixed ratios to the true optimum (off-centre on purpose): every budget's curve is
    # the same shape in log N up to scale, so each parabola misses the optimum by the same
    # factor and a is exact even though a parabola only approximates the curve.
    fit = fit_isoflop(isoflop_frame(lambda C: LAW.n_opt(C) * np.geomspace(1 / 8, 3, 9)))
    assert fit.a == pytest.approx(TRUE_A, abs=1e-9)
    assert fit.n_used == 5 and fit.trustworthy and fit.flags == ""
    # The shared miss: 2.3% over N_opt for this window (measured); far below the decade spanned.
    ratio = fit.budgets["n_opt"] / LAW.n_opt(fit.budgets["budget"])
    assert np.allclose(ratio, ratio.iloc[0], rtol=1e-9) and ratio.iloc[0] == pytest.approx(
        1, abs=0.03
    )
    assert fit.n_opt(1e20) == pytest.approx(LAW.n_opt(1e20), rel=0.03)
    assert fit.d_opt(1e20) * fit.n_opt(1e20) * 6 == pytest.approx(1e20)
    assert np.allclose(fit.budgets["d_opt"], fit.budgets["budget"] / (6 * fit.budgets["n_opt"]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_exponent_with_noise_and_ci_covers_it(seed):
    frame = isoflop_frame(
        lambda C: LAW.n_opt(C) * np.geomspace(1 / 4, 4, 9), noise=0.003, seed=seed
    )
    fit = fit_isoflop(frame, n_boot=400, seed=seed)
    # 0.3% loss noise: |a - truth| was <= 0.012 over 5 seeds.
    assert fit.a == pytest.approx(TRUE_A, abs=0.02)
    lo, hi = fit.ci
    assert lo <= TRUE_A <= hi and hi - lo < 0.1


def test_budget_with_minimum_outside_sampled_range_is_flagged_and_left_out():
    def sizes(budget):
        # The largest budget only samples models 10-100x below its optimum.
        top = budget == BUDGETS[-1]
        return LAW.n_opt(budget) * (np.geomspace(0.01, 0.1, 5) if top else np.geomspace(0.25, 4, 7))

    frame = isoflop_frame(sizes)
    # Two sizes only: no parabola at all.
    few = isoflop_frame(lambda C: LAW.n_opt(C) * np.array([0.5, 2.0]), budgets=[1e23])
    fit = fit_isoflop(pd.concat([frame, few]))
    rows = fit.budgets.set_index("budget")
    assert not rows.loc[BUDGETS[-1], "used"]
    assert rows.loc[BUDGETS[-1], "flag"].startswith("minimum above sampled N")
    assert np.isnan(rows.loc[BUDGETS[-1], "n_opt"])
    assert not rows.loc[1e23, "used"] and rows.loc[1e23, "flag"] == "fewer than 3 sizes"
    assert rows["used"].sum() == 4
    # The flagged budgets do not pull the law off: the other four still give the exponent.
    assert fit.a == pytest.approx(TRUE_A, abs=1e-9)


def test_minimum_below_range_and_too_few_budgets_give_no_law():
    def sizes(budget):
        first = budget == BUDGETS[0]
        return LAW.n_opt(budget) * (np.geomspace(10, 100, 5) if first else np.geomspace(0.25, 4, 7))

    fit = fit_isoflop(isoflop_frame(sizes, budgets=BUDGETS[:2]))
    assert fit.budgets.iloc[0]["flag"].startswith("minimum below sampled N")
    assert np.isnan(fit.a) and np.isnan(fit.n_opt(1e20))
    assert not fit.trustworthy and "no fit" in fit.flags


def test_two_budgets_are_flagged_under_determined():
    fit = fit_isoflop(
        isoflop_frame(lambda C: LAW.n_opt(C) * np.geomspace(0.25, 4, 7), budgets=BUDGETS[:2])
    )
    assert fit.a == pytest.approx(TRUE_A, abs=1e-9)
    assert "under-determined (2 budgets)" in fit.flags and not fit.trustworthy


def test_three_runs_per_budget_give_no_bootstrap_ci():
    # Resampling 3 runs mostly repeats one and loses the budget; a CI from the rest would be
    # near zero width, so there is none and the fit says why.
    fit = fit_isoflop(isoflop_frame(lambda C: LAW.n_opt(C) * np.array([0.3, 1.0, 3.0])))
    assert fit.a == pytest.approx(TRUE_A, abs=1e-9)
    assert fit.ci is None and "no bootstrap CI" in fit.flags and not fit.trustworthy


def test_diverged_runs_drop_out():
    frame = isoflop_frame(lambda C: LAW.n_opt(C) * np.geomspace(0.25, 4, 7))
    frame.loc[frame.index[::7], "min_val_loss"] = np.nan
    fit = fit_isoflop(frame)
    assert (fit.budgets["n_runs"] == 6).all()
    assert fit.a == pytest.approx(TRUE_A, abs=1e-9)


def test_table_puts_isoflop_and_chinchilla_exponents_side_by_side():
    frame = isoflop_frame(lambda C: LAW.n_opt(C) * np.geomspace(1 / 8, 8, 7), noise=0.002, seed=4)
    laws = chinchilla_laws(frame, n_boot=0)
    fits = {"bf16_bf16": fit_isoflop(frame, n_boot=200)}
    row = isoflop_table(fits, laws, 1e22).iloc[0]
    a_iso = float(row["a_isoflop"].split()[0])
    a_chin = float(row["a_chinchilla"])
    # Both estimate the same exponent of the same law.
    assert a_iso == pytest.approx(TRUE_A, abs=0.02)
    assert a_chin == pytest.approx(TRUE_A, abs=0.02)
    assert row["budgets_used"] == "5/5" and row["trustworthy"]
    assert row["n_opt_chinchilla"] == pytest.approx(LAW.n_opt(1e22), rel=0.1)


def test_report_writes_isoflop_table_and_plot(tmp_path):
    sweep = tmp_path / "sweep"
    write_synthetic_sweep(
        sweep,
        configs={"bf16_bf16": 1.0, "fp8_e4m3_fp8_e4m3": 0.6},
        budgets=[1e12, 1e13, 1e14],
        shapes=[(16, 1), (32, 1), (64, 1), (128, 2), (256, 4)],
        n_points=20,
        metrics=False,
    )
    out = tmp_path / "out"
    paths = analyze(
        sweep, paper=False, plots=["isoflop"], tables=["isoflop"], out_dir=out, n_boot=4
    )
    names = {p.name for p in paths}
    assert {"isoflop.png", "isoflop.pdf", "isoflop.md", "isoflop_budgets.csv"} <= names
    assert (out / "isoflop.png").stat().st_size > 20_000
    table = pd.read_csv(out / "isoflop.csv")
    assert list(table["config"]) == ["bf16_bf16", "fp8_e4m3_fp8_e4m3"]
    assert {"a_isoflop", "a_chinchilla", "flags"} <= set(table.columns)
    budgets = pd.read_csv(out / "isoflop_budgets.csv")
    assert len(budgets) == 6 and set(budgets["n_sizes"]) == {5}
