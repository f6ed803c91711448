"""Stop requests: SIGTERM/SIGUSR2 become a flag the loop checks between steps, and the
exception that ends an attempt after its checkpoint was written."""

from __future__ import annotations

import signal
import threading
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


class Preempted(Exception):  # noqa: N818 - the name is the runner's contract
    """Raised after a checkpoint was written because SIGTERM/SIGUSR2 arrived."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


class StopSignals:
    """Turns SIGTERM/SIGUSR2 into a flag the loop checks between steps (the ranks of a
    multi-process run agree on it, so they all stop after the same step)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        # Signal handlers can only be installed from the main thread (Ray may use others).
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signum

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        # After a stop request the process is on its way out; SLURM signals the step and
        # the array task forwards the signal too, and that second copy must not kill it
        # (nor a copy that reaches a rank which learnt of the stop from another rank).
        stopping = self.received is not None or exc_type is Preempted
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if stopping else handler)
