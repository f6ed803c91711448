"""Live progress of a launch: done / running / failed / ETA, failures printed as they happen."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class LaunchProgress:
    """A Rich progress bar fed by executor events; a no-op until ``start`` is called."""

    def __init__(self, console: Console):
        self.console = console
        self.failures = 0
        self.done = 0
        self._progress: Progress | None = None
        self._task = None
        self._total = 0
        self._started_at = time.monotonic()

    def __enter__(self) -> LaunchProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start(self, records, executor: str) -> None:
        """Called by launch once it knows which runs it submits."""
        self._total = len(records)
        if not records or executor == "slurm":
            return
        self._progress = Progress(
            TextColumn("[bold]runs"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task("runs", total=self._total, detail="")
        self._progress.start()

    def on_event(self, event: str, run_id: str, outcome) -> None:
        """Executor callback: a run ended as done / preempted / failed / crashed."""
        if event == "done":
            self.done += 1
        else:
            self.failures += 1
            self.console.print(f"[red]{event}[/red] {run_id} (see `sweep logs <dir> {run_id}`)")
        if self._progress is not None:
            ended = self.done + self.failures
            self._progress.update(
                self._task, completed=ended, detail=f"done {self.done}  failed {self.failures}"
            )
