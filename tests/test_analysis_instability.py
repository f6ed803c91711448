"""Instability detectors on synthetic curves with known events, and the paper's pattern."""

import numpy as np
import pytest

from analysis.configs import parse_config
from analysis.instability import (
    Thresholds,
    classify_runs,
    curve_instability,
    divergence_index,
    frequency_table,
    ma_onset,
    spike_events,
)
from analysis.load import load_paper_curves, load_paper_runs


def noisy_curve(n: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(n)
    return 2.5 + 5.0 * np.exp(-t / 200) + rng.normal(0, 0.02, n)


def test_spike_detector_precision_recall():
    rng = np.random.default_rng(0)
    found = injected = true_pos = 0
    for _ in range(10):
        loss = noisy_curve(3000, rng)
        where = np.sort(rng.choice(np.arange(100, 2990, 60), 8, replace=False))
        for i in where:
            loss[i : i + rng.integers(1, 4)] += rng.uniform(0.3, 1.0)
        events = spike_events(loss)
        starts = np.array([e[0] for e in events])
        injected += len(where)
        found += len(events)
        true_pos += sum(bool(np.any(np.abs(starts - i) <= 2)) for i in where)
    precision, recall = true_pos / max(found, 1), true_pos / injected
    assert precision >= 0.9 and recall >= 0.9, (precision, recall)


def test_no_spikes_on_clean_noise_and_window_must_fill():
    rng = np.random.default_rng(1)
    loss = noisy_curve(2000, rng)
    assert spike_events(loss) == []
    loss[10] += 5.0  # before the 50-point window is full: not judged
    assert spike_events(loss) == []


def test_ma_onset_finds_rise_and_divergence_finds_nan_or_overshoot():
    rng = np.random.default_rng(2)
    loss = noisy_curve(1000, rng)
    loss[600:] += np.linspace(0, 8, 400)  # slope 0.02 per point > 0.008
    onset = ma_onset(loss)
    assert onset is not None and 600 <= onset <= 660
    assert ma_onset(noisy_curve(1000, rng)) is None
    assert divergence_index([5.0, 4.0, np.nan, 3.0]) == 2
    assert divergence_index([5.0, 4.0, 5.5]) == 2
    assert divergence_index([5.0, 4.0, 3.0]) is None


def test_curve_instability_maps_indices_to_steps():
    rng = np.random.default_rng(3)
    loss = noisy_curve(500, rng)
    loss[300:] += np.linspace(0, 10, 200)
    facts = curve_instability(loss, steps=np.arange(500) * 10, tokens=np.arange(500) * 4096)
    assert facts["curve_diverged"] and facts["diverged_at_step"] >= 3000
    assert facts["onset_tokens"] == facts["onset_step"] * 4096 // 10


def test_bad_thresholds_raise():
    with pytest.raises(ValueError, match="window"):
        Thresholds(window=0)


def test_paper_table_shows_the_papers_pattern():
    freq = frequency_table(classify_runs(load_paper_runs()), by=("config", "budget"))
    parsed = freq["config"].map(parse_config)
    big = freq["budget"] >= 4.5e18
    fully_mx = parsed.map(lambda c: c.fully_mx)
    safe = parsed.map(lambda c: c.a_fmt == "bf16" or "quantize_only_fwd" in c.variant)
    rate = lambda mask: freq[mask]["unstable"].sum() / freq[mask]["total"].sum()  # noqa: E731
    assert rate(big & fully_mx) > 0.25
    assert rate(big & safe) < 0.03
    assert rate(~big & fully_mx) < 0.1  # small budgets are stable in every format
    assert freq["total"].sum() >= 1100


def test_paper_curves_load_and_detect_rises():
    curves = load_paper_curves()
    assert curves["run_id"].nunique() == 48 and set(curves["config"]) == {"fp6_e3m2_fp6_e3m2"}
    t = Thresholds(window=10, ma_window=5)
    onsets = [
        curve_instability(g["value"].to_numpy(), thresholds=t)["onset_step"]
        for _, g in curves[curves["name"] == "train/loss"].groupby("run_id")
    ]
    flagged = sum(o is not None for o in onsets)
    # Some of these fully-MX runs blow up late, most do not.
    assert 0 < flagged < 48
