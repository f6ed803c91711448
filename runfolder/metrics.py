"""The metrics table of a run folder: its schema and the metric names writers log.

Step metrics are one long table (one row per run, step and metric name) stored as numbered
Parquet parts under ``metrics/`` (runfolder.paths.part_path). pyarrow is imported only when
the schema is asked for, so the rest of the package stays stdlib-only.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

METRIC_COLUMNS = ("run_id", "step", "tokens", "flops", "name", "value", "wall_time")

# Metric names (the ``name`` column). Families are a prefix plus a module or tensor name.
TRAIN_LOSS = "train/loss"
TRAIN_LR = "train/lr"
VAL_LOSS = "val/loss"
VAL_LOSS_QUANTIZED = "val/loss_quantized"
GRAD_NORM = "optim/grad_norm"
STEP_TIME = "perf/step_time"
TOKENS_PER_S = "perf/tokens_per_s"
PAIRED_FP32_LOSS = "paired/fp32_loss"
PAIRED_FP32_VAL_LOSS = "paired/fp32_val_loss"
GRAD_NORM_PREFIX = "grad_norm/"
MX_CLIP_PREFIX = "mx/clip/"
PAIRED_PREFIX = "paired/"


@cache
def metrics_schema() -> pa.Schema:
    """The Arrow schema of every metrics part (``name`` dictionary-encoded)."""
    import pyarrow as pa

    types = {
        "run_id": pa.string(),
        "step": pa.int64(),
        "tokens": pa.int64(),
        "flops": pa.float64(),
        "name": pa.dictionary(pa.int32(), pa.string()),
        "value": pa.float64(),
        "wall_time": pa.float64(),
    }
    return pa.schema([(column, types[column]) for column in METRIC_COLUMNS])
