"""Live progress of a launch: runs done / failed / ETA for executors that run them, array
chunks submitted for SLURM; failures and chunks printed as they happen."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from sweep.executors.registry import executor_class

if TYPE_CHECKING:
    from sweep.executors.slurm import ChunkSubmitted


class LaunchProgress:
    """Rich progress bars fed by executor callbacks; a no-op until ``start`` is called.

    Executors that wait for their runs (``waits_for_runs``: local, ray) report each run's
    end to ``on_event``; the SLURM executor reports each array chunk sbatch accepted to
    ``on_chunk``, which prints one line per chunk and, on a terminal only, moves a bar over
    the chunks.
    """

    def __init__(self, console: Console):
        self.console = console
        self.failures = 0
        self.done = 0
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> LaunchProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start(self, records, executor: str) -> None:
        """Called by launch once it knows which runs it submits (and the executor's name)."""
        if not records:
            return
        runs_end_here = executor_class(executor).waits_for_runs
        if self._progress is not None and runs_end_here:
            # A retry round of the same launch: its runs join the bar already shown.
            total = self._progress.tasks[0].total or 0
            self._progress.update(self._task, total=total + len(records))
            return
        if runs_end_here:
            self._show("runs", len(records), "")
        elif self.console.is_terminal:
            # The number of chunks is the executor's to work out (MaxArraySize).
            self._show("chunks", None, f"runs 0/{len(records)}")

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

    def on_chunk(self, chunk: ChunkSubmitted) -> None:
        """SLURM executor callback: sbatch accepted one more array chunk."""
        self.console.print(
            f"chunk {chunk.index}/{chunk.chunks}: array {chunk.array_id}, {chunk.size} runs "
            f"({chunk.runs_submitted}/{chunk.runs_total} submitted)",
            highlight=False,
        )
        if self._progress is not None:
            self._progress.update(
                self._task,
                total=chunk.chunks,
                completed=chunk.index,
                detail=f"runs {chunk.runs_submitted}/{chunk.runs_total}",
            )

    def _show(self, label: str, total: int | None, detail: str) -> None:
        self._progress = Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self._task = self._progress.add_task(label, total=total, detail=detail)
        self._progress.start()
