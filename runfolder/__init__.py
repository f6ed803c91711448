"""The run-folder contract: every writer and reader of a run folder goes through here.

Stdlib only (pyarrow lazily, for the metrics schema), so `sweep status` and the analysis
import it without torch or pydantic. Modules: paths (file and folder names, log and
checkpoint naming), records (typed records, their readers and writers), metrics (schema,
metric names), codes (exit codes), atomic (atomic writes, the JSON reader), label.
"""

from runfolder.atomic import atomic_write, atomic_write_json, atomic_write_text, read_json
from runfolder.codes import EXIT_FAILED, EXIT_OK, EXIT_PREEMPTED
from runfolder.label import config_label, precision_label
from runfolder.paths import RunPaths, checkpoint_path, checkpoint_steps, log_name

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "RunPaths",
    "atomic_write",
    "atomic_write_json",
    "atomic_write_text",
    "checkpoint_path",
    "checkpoint_steps",
    "config_label",
    "log_name",
    "precision_label",
    "read_json",
]
