"""Pushdown reads of metrics Parquet parts: only the rows and columns an analysis needs.

A part holds one run's rows in step order, every metric name interleaved, so row-group
statistics cannot skip anything; what saves the work is reading the filter columns first
(``name`` and ``run_id`` as dictionaries: a predicate is evaluated once per distinct value,
not per row), skipping a part with no matching row, and decoding only the projected columns
of the parts that match. Parts are read in parallel threads (Parquet decoding releases the
GIL).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# Columns read as dictionaries: few distinct values, many rows.
DICTIONARY_COLUMNS = ("run_id", "name")
Predicate = Callable[[str], bool]


def _keep_rows(column: pa.ChunkedArray, keep: Predicate) -> np.ndarray:
    """Boolean row mask of a dictionary column, ``keep`` evaluated per distinct value."""
    masks = []
    for chunk in column.chunks:
        by_code = np.array([keep(v) for v in chunk.dictionary.to_pylist()] + [False])
        codes = chunk.indices.fill_null(len(by_code) - 1).to_numpy()
        masks.append(by_code[codes])
    return np.concatenate(masks) if masks else np.zeros(0, bool)


def read_part(
    path: Path, schema: pa.Schema, columns: Sequence[str], filters: dict[str, Predicate]
) -> pa.Table | None:
    """``columns`` of the rows of one part whose ``filters`` columns (dictionary columns:
    column -> keep(value)) all pass, cast to ``schema``; None when no row passes."""
    part = pq.ParquetFile(path, read_dictionary=list(DICTIONARY_COLUMNS))
    present = set(part.schema_arrow.names)
    rows = None
    first = [c for c in filters if c in present]
    if len(first) < len(filters):
        return None  # a part without the column cannot match a value of it
    table = part.read(columns=first, use_threads=False) if first else None
    for column in first:
        mask = _keep_rows(table.column(column), filters[column])
        rows = mask if rows is None else rows & mask
    if rows is not None and not rows.any():
        return None
    rest = [c for c in columns if c not in first and c in present]
    more = part.read(columns=rest, use_threads=False)
    if table is not None:
        for column in more.column_names:
            table = table.append_column(column, more.column(column))
    else:
        table = more
    if rows is not None and not rows.all():
        table = table.take(np.flatnonzero(rows))
    for column in columns:  # old parts may lack a column: nulls, as a dataset scan gives
        if column not in table.column_names:
            table = table.append_column(column, pa.nulls(len(table), schema.field(column).type))
    wanted = pa.schema([schema.field(c) for c in columns])
    return table.select(list(columns)).cast(wanted)


def read_parts(
    paths: Sequence[Path], schema: pa.Schema, columns: Sequence[str], filters: dict[str, Predicate]
) -> pa.Table:
    """:func:`read_part` of every part in parallel, concatenated (parts' order kept)."""
    workers = max(1, min(len(paths), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        tables = [t for t in pool.map(lambda p: read_part(p, schema, columns, filters), paths)]
    tables = [t for t in tables if t is not None]
    if not tables:
        return pa.schema([schema.field(c) for c in columns]).empty_table()
    return pa.concat_tables(tables)
