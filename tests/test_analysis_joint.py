"""Joint precision-aware law: recovers per-format efficiency factors; LOBO comparison."""

import numpy as np
import pandas as pd
import pytest

from analysis.joint import fit_joint, leave_one_budget_out
from analysis.synthetic import Law

EFFICIENCY = {"bf16_bf16": 1.0, "fp8_e4m3_fp8_e4m3": 0.6, "fp6_e2m3_fp6_e2m3": 0.3}


def runs_from_law(noise: float = 0.002, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    law = Law()
    rows = []
    for config, eff in EFFICIENCY.items():
        for budget in np.geomspace(1e12, 1e15, 5):
            for n in np.geomspace(3e4, 1e6, 5):
                d = budget / (6 * n)
                loss = law.loss(n, d, eff) * np.exp(rng.normal(0, noise))
                rows.append(
                    {
                        "config": config,
                        "budget": budget,
                        "n_params": n,
                        "tokens": d,
                        "flops": budget,
                        "min_val_loss": loss,
                    }
                )
    return pd.DataFrame(rows)


def test_joint_fit_recovers_efficiencies_and_shared_law():
    fit = fit_joint(runs_from_law())
    assert fit.converged and fit.reference == "bf16_bf16" and not fit.at_bounds
    for config, eff in EFFICIENCY.items():
        assert fit.efficiency[config] == pytest.approx(eff, rel=0.15)
    law = Law()
    assert fit.alpha == pytest.approx(law.alpha, abs=0.05)
    assert fit.beta == pytest.approx(law.beta, abs=0.05)
    assert abs(fit.E - law.E) < 0.15


def test_leave_one_budget_out_reports_both_forms():
    lobo = leave_one_budget_out(runs_from_law())
    assert set(lobo["form"]) == {"per-config chinchilla", "joint precision-aware"}
    assert lobo["held_out_budget"].nunique() == 5
    # Data drawn from the joint law: the joint form extrapolates within ~noise.
    joint = lobo[lobo["form"] == "joint precision-aware"]["mean_abs_rel_error"]
    assert joint.max() < 0.01


def test_joint_fit_needs_data():
    empty = runs_from_law().assign(min_val_loss=np.nan)
    with pytest.raises(ValueError, match="no runs"):
        fit_joint(empty)
