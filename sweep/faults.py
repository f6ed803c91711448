"""Fault injection for crash-consistency tests: the launcher SIGKILLs itself at a named step.

``SWEEP_KILL_AT=<point>-<n>`` kills the process the n-th time it passes ``point``. Points,
in the order a SLURM launch passes them:

- ``spec``: after staging one run's spec.json (the batch is committed after the last)
- ``before-sbatch``: a chunk's intent is recorded, sbatch not called yet
- ``sbatch-retry``: a try's sbatch failed transiently, the next try not made yet
- ``after-sbatch``: sbatch accepted the chunk, its job id is not recorded yet
- ``submitted``: after staging one run's submitted.json (committed after the chunk's last)
- ``after-chunk``: a chunk is fully recorded

Unset (the normal case), ``passed`` costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter

KILL_AT_ENV = "SWEEP_KILL_AT"
POINTS = ("spec", "before-sbatch", "sbatch-retry", "after-sbatch", "submitted", "after-chunk")
_passes: Counter[str] = Counter()


def passed(point: str) -> None:
    """Count one pass of ``point``; SIGKILL this process if SWEEP_KILL_AT names this pass."""
    target = os.environ.get(KILL_AT_ENV)
    if not target:
        return
    _passes[point] += 1
    if target == f"{point}-{_passes[point]}":
        print(f"{KILL_AT_ENV}={target}: killing the launcher", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
