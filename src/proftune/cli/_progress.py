"""A rich progress bar for the fit loop, on stderr, quiet when stderr is not a terminal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ..task import Task
from ..train import Callback, FitState
from ._common import err_console, parse_params, progress_enabled, task_arg
from ._options import FitOpts, RunOpts

T = TypeVar("T")


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


def train_task(fn: Callable[..., T], task: str, t: FitOpts, o: RunOpts, *, description: str = "train",
               **options: Any) -> T:
    """``fn(task, params, ...)`` of a command that trains TASK (``train``, ``diagnose``): the params
    checked, the task loaded, and an epoch progress bar among its callbacks."""
    from ..task import load_task

    params = parse_params(t.param)
    task_obj = load_task(task_arg(task, t.data))
    progress = EpochProgress.for_run(task_obj, t.epochs, t.max_steps, description=description)
    return fn(task_obj, params, epochs=t.epochs, max_steps=t.max_steps, device=o.device, seed=o.seed, db=o.db,
              callbacks=[progress], **options)
