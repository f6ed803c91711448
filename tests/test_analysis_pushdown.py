"""Metric pushdown: a filtered load returns exactly the rows of a full load filtered
afterwards, and no analysis reads more metric names or columns than its items need."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import analysis.scan
from analysis.load import METRIC_COLUMNS, load_metrics
from analysis.registry import CURVE_COLUMNS
from analysis.report import analyze
from analysis.synthetic import wide_metric_names, write_synthetic_sweep, write_wide_sweep

N_RUNS, N_STEPS, N_NAMES = 6, 40, 12


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("wide")
    write_wide_sweep(sweep, N_RUNS, N_STEPS, N_NAMES)
    # One part as an old writer left it: ``name`` a plain string column.
    part = next(sweep.glob("runs/*/metrics/part-00000.parquet"))
    table = pq.read_table(part)
    pq.write_table(table.set_column(4, "name", table.column("name").cast(pa.string())), part)
    return sweep


def _rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Comparable rows: categoricals as strings, a fixed order and index."""
    frame = frame.astype({c: str for c in ("run_id", "name") if c in frame})
    keys = [c for c in ("run_id", "name", "step") if c in frame]
    return frame.sort_values([*keys, *(c for c in frame if c not in keys)]).reset_index(drop=True)


def test_generator_writes_every_name_at_every_step(wide):
    full = load_metrics(wide)
    assert len(full) == N_RUNS * N_STEPS * N_NAMES
    assert set(full["name"].astype(str)) == set(wide_metric_names(N_NAMES))
    assert list(full.columns) == list(METRIC_COLUMNS)


def _reference(full: pd.DataFrame, names, suffixes, run_ids) -> pd.Series:
    """The rows a pushdown load must return, selected in pandas from the full load."""
    keep = pd.Series(True, index=full.index)
    if names is not None or suffixes:
        keep = full["name"].isin(names or [])
        for suffix in suffixes:
            keep |= full["name"].str.endswith(suffix)
    return keep & (full["run_id"].isin(run_ids) if run_ids is not None else True)


@pytest.mark.parametrize(
    ("names", "suffixes", "two_runs"),
    [
        (["train/loss", "val/loss"], (), False),
        (["val/loss"], [".fc1/a"], False),
        ([], ["/weight_clip"], False),
        (["nope"], (), False),
        (None, (), True),
        (["train/loss"], (), True),
    ],
)
def test_pushdown_equals_full_load_filtered_afterwards(wide, names, suffixes, two_runs):
    full = _rows(load_metrics(wide))
    run_ids = sorted(set(full["run_id"]))[1:3] if two_runs else None
    expected_rows = full[_reference(full, names, suffixes, run_ids)]
    assert len(expected_rows) or names == ["nope"]
    for columns in (None, ["run_id", "step", "value"], ["value", "name", "run_id", "step"]):
        got = _rows(load_metrics(wide, names, run_ids, suffixes=suffixes, columns=columns))
        expected = _rows(expected_rows if columns is None else expected_rows[columns])
        pd.testing.assert_frame_equal(got, expected, check_dtype=False)
        assert list(got.columns) == (list(METRIC_COLUMNS) if columns is None else columns)


def test_a_wanted_name_is_found_in_few_rows(wide):
    got = load_metrics(wide, names=["train/loss"], columns=["run_id", "step", "value"])
    assert len(got) == N_RUNS * N_STEPS
    assert got.groupby("run_id", observed=True)["step"].apply(list).map(len).eq(N_STEPS).all()
    with pytest.raises(ValueError, match="unknown metric columns \\['loss'\\]"):
        load_metrics(wide, columns=["loss"])


def test_no_analysis_reads_more_than_its_items_need(tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    write_synthetic_sweep(
        sweep,
        configs={"bf16_bf16": 1.0, "fp8_e4m3_fp8_e4m3": 0.7},
        budgets=[1e12, 1e13],
        shapes=[(32, 1), (64, 1)],
        n_points=30,
    )
    reads: list[tuple[tuple[str, ...], dict]] = []
    real = analysis.scan.read_part

    def spy(path, schema, columns, filters):
        reads.append((tuple(columns), filters))
        return real(path, schema, columns, filters)

    monkeypatch.setattr(analysis.scan, "read_part", spy)
    analyze(sweep, paper=False, plots=["scaling", "frontier"], tables=["mitigations"],
            out_dir=tmp_path / "a", n_boot=0)  # fmt: skip
    assert reads == []  # summaries only: no Parquet part is opened
    analyze(sweep, paper=False, plots=["all"], tables=["all"], out_dir=tmp_path / "b", n_boot=0)
    assert reads, "curves/instability read the metrics"
    for columns, filters in reads:
        assert "name" in filters and set(columns) <= set(CURVE_COLUMNS)
        assert not filters["name"]("optim/lr") and filters["name"]("train/loss")
