"""Scaling-law fits recover known laws; the loss-scale pitfall stays fixed."""

import numpy as np
import pandas as pd
import pytest

from analysis.fit import bootstrap, fit_chinchilla, fit_compute, fit_kaplan
from analysis.laws import chinchilla_laws, kaplan_laws
from analysis.tables import forms_table

TRUE = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}  # Hoffmann et al.


def chinchilla_data(n: int = 120, noise: float = 0.003, seed: int = 1):
    rng = np.random.default_rng(seed)
    N = np.exp(rng.uniform(np.log(2e7), np.log(2e9), n))
    D = np.exp(rng.uniform(np.log(1e9), np.log(1e11), n))
    L = TRUE["E"] + TRUE["A"] / N ** TRUE["alpha"] + TRUE["B"] / D ** TRUE["beta"]
    return N, D, L * np.exp(rng.normal(0, noise, n))


def test_chinchilla_recovers_known_law():
    N, D, L = chinchilla_data()
    fit = fit_chinchilla(N, D, L)
    assert fit.converged and not fit.at_bounds and fit.n_starts >= 100
    # Tolerances measured over seeds at 0.3% noise; N/D ranges as in the paper's grid.
    assert fit.alpha == pytest.approx(TRUE["alpha"], abs=0.03)
    assert fit.beta == pytest.approx(TRUE["beta"], abs=0.03)
    assert pytest.approx(TRUE["E"], abs=0.1) == fit.E
    truth = TRUE["E"] + TRUE["A"] / 1e9 ** TRUE["alpha"] + TRUE["B"] / 2e10 ** TRUE["beta"]
    assert fit.predict(1e9, 2e10) == pytest.approx(truth, rel=0.005)


def test_unscaled_objective_stops_early_scaled_does_not():
    """Regression: the mean log-Huber (~1e-5) makes L-BFGS stop early unless scaled."""
    N, D, L = chinchilla_data()
    start = np.array([5.0, 5.0, 0.0, 0.5, 0.5])
    scaled = fit_chinchilla(N, D, L, scale=1e6, n_starts=1, start=start)
    unscaled = fit_chinchilla(N, D, L, scale=1.0, n_starts=1, start=start)
    assert scaled.alpha == pytest.approx(TRUE["alpha"], abs=0.03)
    assert abs(unscaled.alpha - TRUE["alpha"]) > 0.04


def test_compute_optimal_allocation_minimises_loss_on_isoflop():
    N, D, L = chinchilla_data()
    fit = fit_chinchilla(N, D, L)
    C = 1e21
    ns = np.geomspace(1e8, 1e11, 4001)
    best = ns[np.argmin(fit.predict(ns, C / (6 * ns)))]
    assert fit.n_opt(C) == pytest.approx(best, rel=0.01)
    assert 6 * fit.n_opt(C) * fit.d_opt(C) == pytest.approx(C)


def test_compute_form_and_bootstrap_ci_cover_truth():
    rng = np.random.default_rng(3)
    C = np.geomspace(1e17, 1e20, 8)
    L = (0.6 + 80.0 * C**-0.12) * np.exp(rng.normal(0, 0.002, len(C)))
    fit = fit_compute(C, L)
    assert fit.gamma == pytest.approx(0.12, abs=0.03) and pytest.approx(0.6, abs=0.15) == fit.E
    boot = bootstrap(fit, (C,), L, n_boot=12, workers=2)
    lo, hi = boot.fit.ci["gamma"]
    assert lo <= boot.fit.gamma <= hi
    band = boot.loss_ci(np.array([1e21]))
    assert band[0][0] <= fit.loss_at(1e21) <= band[1][0]


def test_underdetermined_fit_is_flagged_but_usable():
    C = np.array([1e12, 1e13, 1e14])
    fit = fit_compute(C, 1.8 + 30 * C**-0.1)
    assert fit.underdetermined and "under-determined" in fit.flags()
    assert fit.converged and not fit.at_bounds
    assert fit.predict(1e13) == pytest.approx(1.8 + 30 * 1e13**-0.1, rel=1e-3)


def test_unpinnable_fit_is_flagged_at_bound():
    # Loss flat in D: beta/B cannot be pinned down, the fit must say so.
    rng = np.random.default_rng(0)
    N = np.exp(rng.uniform(np.log(1e7), np.log(1e9), 40))
    D = np.exp(rng.uniform(np.log(1e9), np.log(1e10), 40))
    fit = fit_chinchilla(N, D, 2.0 + 50 / N**0.3, n_starts=20)
    assert not fit.trustworthy and fit.at_bounds


KAPLAN = {"A": 1e8, "B": 1e9, "E": 1.5, "alpha": 0.3, "beta": 0.4}


def kaplan_data(n: int = 60, noise: float = 0.0, seed: int = 2, **law: float):
    p = KAPLAN | law
    rng = np.random.default_rng(seed)
    N = np.exp(rng.uniform(np.log(1e7), np.log(1e9), n))
    D = np.exp(rng.uniform(np.log(1e9), np.log(1e11), n))
    L = ((p["A"] / N) ** (p["alpha"] / p["beta"]) + p["B"] / D) ** p["beta"] + p["E"]
    return N, D, L * np.exp(rng.normal(0, noise, n))


def test_kaplan_recovers_its_own_law():
    N, D, L = kaplan_data(noise=0.002)
    fit = fit_kaplan(N, D, L)
    # Analytic gradient: L-BFGS-B stops on a small projected gradient, not on a stalled step.
    assert fit.converged and not fit.at_bounds and fit.grad_norm < 1e-2
    # At 0.2% noise the worst errors over 15 seeds were 0.006 (alpha), 0.013 (beta), 0.021 (E).
    assert fit.alpha == pytest.approx(KAPLAN["alpha"], abs=0.015)
    assert fit.beta == pytest.approx(KAPLAN["beta"], abs=0.03)
    assert pytest.approx(KAPLAN["E"], abs=0.05) == fit.E
    assert np.max(np.abs(fit.predict(N, D) / L - 1)) < 0.01


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kaplan_best_grid_starts_find_the_optimum(seed):
    """The batched grid scoring ranks starts well: the best 3 reach what the best 40 reach
    (measured: 15/15 seeds; the best 1 alone: 13/15, seeds 1 and 3 miss)."""
    N, D, L = kaplan_data(noise=0.002, seed=seed)
    few, many = fit_kaplan(N, D, L, n_starts=3), fit_kaplan(N, D, L, n_starts=40)
    assert few.objective == pytest.approx(many.objective, rel=1e-4)


def test_kaplan_compute_optimal_allocation_minimises_loss_on_isoflop():
    fit = fit_kaplan(*kaplan_data())
    C = 1e20
    ns = np.geomspace(1e6, 1e12, 6001)
    assert fit.n_opt(C) == pytest.approx(ns[np.argmin(fit.predict(ns, C / (6 * ns)))], rel=0.01)
    assert fit.loss_at(C) == pytest.approx(fit.predict(ns, C / (6 * ns)).min(), rel=1e-6)
    assert fit.n_opt(10 * C) / fit.n_opt(C) == pytest.approx(10**fit.n_opt_exponent)


def test_kaplan_rows_sit_next_to_chinchilla_rows_in_fits_table():
    parts = []
    for config, alpha in (("bf16_bf16", 0.3), ("fp8_e4m3_fp8_e4m3", 0.25)):
        N, D, L = kaplan_data(n=50, noise=0.002, seed=len(parts), alpha=alpha)
        parts.append(
            pd.DataFrame(
                {"config": config, "n_params": N, "tokens": D, "flops": 6 * N * D}
                | {"budget": 6 * N * D, "min_val_loss": L}
            )
        )
    runs = pd.concat(parts, ignore_index=True)
    laws = {
        "chinchilla": chinchilla_laws(runs, n_boot=0, n_starts=10),
        "kaplan": kaplan_laws(runs, n_boot=8, workers=1),
    }
    table = forms_table(laws, target_flops=1e21)
    assert list(zip(table["config"], table["form"], strict=True)) == [
        ("bf16_bf16", "chinchilla"),
        ("bf16_bf16", "kaplan"),
        ("fp8_e4m3_fp8_e4m3", "chinchilla"),
        ("fp8_e4m3_fp8_e4m3", "kaplan"),
    ]
    kaplan = table[table["form"] == "kaplan"].set_index("config")
    for config, alpha in (("bf16_bf16", 0.3), ("fp8_e4m3_fp8_e4m3", 0.25)):
        row = kaplan.loc[config]
        # "value [lo, hi]" cells: every parameter finite, with a bootstrap CI.
        values = {k: float(row[k].split()[0]) for k in ("A", "B", "E", "alpha", "beta")}
        assert all(np.isfinite(v) for v in values.values()) and "[" in row["alpha"]
        assert values["alpha"] == pytest.approx(alpha, abs=0.03)
        assert values["beta"] == pytest.approx(KAPLAN["beta"], abs=0.04)
        assert row["trustworthy"] and row["flags"] == ""
        assert float(row["n_opt_at_target"]) > 0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (([1.0, 2.0], [1.0]), "equal lengths"),
        (([1.0, -2.0], [3.0, 2.0]), "finite and > 0"),
        (([1.0], [3.0]), "at least 2"),
    ],
)
def test_bad_input_raises(args, match):
    with pytest.raises(ValueError, match=match):
        fit_compute(*args)
