"""Reading a run's Parquet metrics in tests: the rows two attempts of a run must share."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq


def comparable_rows(run_dir: Path) -> pd.DataFrame:
    """A run's metric rows without timing (``perf/*``, wall_time), sorted by step and name;
    asserts no (step, name) pair was written twice."""
    table = pq.read_table(run_dir / "metrics").to_pandas()
    table["name"] = table["name"].astype(str)
    # Timing rows legitimately differ between attempts; everything else must not.
    table = table[~table["name"].str.startswith("perf/")].drop(columns="wall_time")
    assert not table.duplicated(["step", "name"]).any()
    return table.sort_values(["step", "name"]).reset_index(drop=True)
