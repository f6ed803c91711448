"""Analysis against fixed facts: the README's instability counts on the paper's table, and
a fit on data with outliers, where the Huber objective and least squares part ways."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.configs import parse_config
from analysis.fit import fit_compute
from analysis.instability import classify_runs, frequency_table
from analysis.load import load_paper_runs

# The paper's budgets from 4.573e18 FLOPs on (the README rounds it to 4.6e18).
BIG = 4.5e18


def counts(freq, mask) -> tuple[int, int]:
    return int(freq[mask]["unstable"].sum()), int(freq[mask]["total"].sum())


def test_paper_table_instability_counts_are_the_readmes():
    freq = frequency_table(classify_runs(load_paper_runs()), by=("config", "budget"))
    parsed = freq["config"].map(parse_config)
    big = freq["budget"] >= BIG
    fully_mx = parsed.map(lambda c: c.fully_mx)
    safe = parsed.map(lambda c: c.a_fmt == "bf16" or "quantize_only_fwd" in c.variant)
    assert sorted(freq.loc[big, "budget"].unique()) == [4.573e18, 1e19, 2.2e19, 4.84e19]
    assert counts(freq, big & fully_mx) == (76, 259)
    assert counts(freq, big & safe) == (0, 210)
    assert counts(freq, ~big & fully_mx) == (13, 452)
    # All 1,154 published runs but the 3 without a result.
    assert counts(freq, freq["budget"] > 0) == (92, 1151)


def outlier_data():
    rng = np.random.default_rng(5)
    C = np.geomspace(1e17, 1e21, 16)
    L = (0.6 + 80.0 * C**-0.12) * np.exp(rng.normal(0, 0.002, len(C)))
    outliers = np.array([4, 11])
    L[outliers] *= 1.3  # two runs 30% off the law (e.g. a loss spike at the end)
    return C, L, np.setdiff1d(np.arange(len(C)), outliers)


def test_huber_fit_ignores_outliers_that_pull_least_squares_away():
    C, L, clean = outlier_data()
    robust = fit_compute(C, L)  # the default objective: Huber, delta 1e-3 in log space
    squares = fit_compute(C, L, delta=10.0)  # quadratic for every residual here
    assert robust.gamma == pytest.approx(0.12, abs=0.01)
    assert pytest.approx(0.6, abs=0.04) == robust.E
    assert np.max(np.abs(robust.predict(C[clean]) / L[clean] - 1)) < 0.01
    # Least squares bends towards the outliers: far from the law, worse on the clean runs.
    assert abs(squares.gamma - 0.12) > 0.04
    assert np.max(np.abs(squares.predict(C[clean]) / L[clean] - 1)) > 0.03
