"""A rich progress bar for the fit loop, on stderr, quiet when stderr is not a terminal."""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ..task import Task
from ..train import Callback, FitState
from ._common import err_console, progress_enabled


class EpochProgress(Callback):
    """Shows epochs done, the last loss and the last metrics."""

    def __init__(self, total_epochs: int | None, *, description: str = "train") -> None:
        self.total = total_epochs
        self.description = description
        self.enabled = progress_enabled()
        self._progress: Progress | None = None
        self._task: Any = None

    @classmethod
    def for_run(cls, task: Task, epochs: int | None, max_steps: int | None, *,
                description: str = "train") -> EpochProgress:
        """The bar for a run bounded by ``epochs`` or ``max_steps`` (neither: the task's default)."""
        total = epochs if epochs is not None else (None if max_steps else task.default_epochs)
        return cls(total, description=description)

    def on_fit_start(self, state: FitState) -> None:
        if not self.enabled:
            return
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} epochs"),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console, transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(self.description, total=self.total, info="")

    def on_step_end(self, state: FitState) -> None:
        if self._progress is not None and state.step % 10 == 0:
            self._progress.update(self._task, info=f"step {state.step} loss {state.loss:.4f}")

    def on_epoch_end(self, state: FitState) -> None:
        if self._progress is not None:
            shown = " ".join(f"{k} {v:.4f}" for k, v in state.metrics.items())
            self._progress.update(self._task, completed=state.epoch, info=shown)

    def on_fit_end(self, state: FitState) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        self.on_fit_end(state)
