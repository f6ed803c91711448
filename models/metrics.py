"""The run's step metrics: one long table (schema: runfolder.metrics), buffered in memory,
flushed as atomic Parquet parts."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from runfolder.atomic import atomic_write
from runfolder.metrics import METRIC_COLUMNS, metrics_schema
from runfolder.paths import part_indices, part_path


def drop_parts_from(metrics_dir: Path, first: int) -> None:
    """Delete parts numbered ``first`` or higher: rows the last checkpoint does not cover."""
    for index in part_indices(metrics_dir):
        if index >= first:
            part_path(metrics_dir, index).unlink()


class MetricsWriter:
    """Collects rows for one run and writes them as numbered Parquet parts."""

    def __init__(self, metrics_dir: Path, run_id: str, next_part: int = 0) -> None:
        self.dir, self.run_id, self.next_part = metrics_dir, run_id, next_part
        self._rows: dict[str, list] = {name: [] for name in METRIC_COLUMNS if name != "run_id"}

    def log(self, step: int, tokens: int, flops: float, values: dict[str, float]) -> None:
        """Record ``values`` (name -> number) at one step."""
        now = time.time()
        for name, value in values.items():
            for column, item in zip(
                self._rows, (step, tokens, flops, name, float(value), now), strict=True
            ):
                self._rows[column].append(item)

    def flush(self) -> Path | None:
        """Write the buffered rows as the next part (atomically); None when there are none."""
        n_rows = len(self._rows["step"])
        if not n_rows:
            return None
        columns = {"run_id": [self.run_id] * n_rows, **self._rows}
        table = pa.Table.from_pydict(columns, schema=metrics_schema())
        path = atomic_write(
            part_path(self.dir, self.next_part), lambda tmp: pq.write_table(table, tmp)
        )
        self.next_part += 1
        self._rows = {name: [] for name in self._rows}
        return path
