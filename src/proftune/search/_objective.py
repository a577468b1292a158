"""A plain Python objective searched like a Task: a callable from params to metrics.

``search(fn, space, objectives=["loss:min"])``: ``fn(params)`` returns a dict of metrics
(``{"loss": 0.3, "time_s": 1.2}``) or one number, read as the metric ``value``. When ``fn`` takes
a ``seed`` keyword it gets one per evaluation (a repeat of a configuration gets a new seed), so
that a noisy objective can be re-evaluated; without one it is called as it is.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..exceptions import ConfigError
from ..task import Task

__all__ = ["VALUE", "ObjectiveTask", "is_objective", "load_objective"]

#: The metric a number returned by the objective is recorded as.
VALUE = "value"


def is_objective(obj: Any) -> bool:
    """A callable that is neither a Task, a Task class nor a spec string."""
    import torch

    if isinstance(obj, (Task, str, torch.nn.Module)) or isinstance(obj, type):
        return False  # a model (a bare module, a LightningModule) is a task's, through its adapter
    return callable(obj)


def load_objective(spec: str) -> Callable[..., Any] | None:
    """The plain function ``spec`` names (``file.py:fn``, ``package.module:fn``), or None where it
    names none (a Task, a built-in task): ``proftune tune obj.py:fn`` searches it as
    :func:`proftune.search` does a callable. A file is imported only where its top level defines
    ``fn`` (a Task file is imported once, by the task loader)."""
    import ast
    import importlib
    from pathlib import Path

    from ..exceptions import TaskLoadError
    from ..task import import_file

    head, _, name = spec.strip().rpartition(":")
    if not head or not name.isidentifier():
        return None
    path = Path(head)
    if head.endswith(".py") or path.is_file():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, SyntaxError, UnicodeDecodeError):
            return None  # the task loader says what is wrong with the file
        if not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body):
            return None
        try:
            module = import_file(path.resolve())
        except Exception as exc:
            raise TaskLoadError(f"importing {str(path)!r} for the objective {name!r} failed: "
                                f"{type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(head)
        except Exception:  # noqa: BLE001  (not a module: the task loader names the problem)
            return None
    fn = getattr(module, name, None)
    return fn if inspect.isfunction(fn) else None


class ObjectiveTask(Task):
    """The Task-shaped holder of a plain objective: the search calls :meth:`call` instead of training."""

    #: Whether :meth:`call` takes ``report=``, a callable of (step, value) that returns True to stop
    #: (a script run in its own process reports its metric as it goes, for the pruner).
    reports_progress: bool = False

    def __init__(self, fn: Callable[..., Any], *, metrics: Sequence[str]) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", type(fn).__name__)  # type: ignore[misc]
        #: The metric names the objective returns (from the objectives and constraints given).
        self.metrics = list(metrics)
        try:
            self.takes_seed = "seed" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            self.takes_seed = False

    def call(self, params: Mapping[str, Any], seed: int) -> dict[str, float]:
        """The objective's metrics at ``params`` (a number is ``{"value": it}``)."""
        out = self.fn(dict(params), seed=seed) if self.takes_seed else self.fn(dict(params))
        if isinstance(out, bool) or not isinstance(out, (int, float, Mapping)):
            raise ConfigError(f"the objective {self.name} must return a dict of metrics or a number, but got "
                              f"{type(out).__name__}: {out!r:.80}.")
        if not isinstance(out, Mapping):
            return {VALUE: float(out)}
        metrics = {}
        for k, v in out.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                metrics[str(k)] = float(v)  # a non-finite value prunes the trial, as in training
        return metrics

    # a plain objective has no model or data: these are never called by the search
    def build_model(self, params: Mapping[str, object]) -> Any:
        raise ConfigError(f"{self.name} is a plain objective; it has no model.")

    def train_data(self, batch_size: int, params: Mapping[str, object]) -> Any:
        raise ConfigError(f"{self.name} is a plain objective; it has no data.")

    def val_data(self, batch_size: int) -> Any:
        raise ConfigError(f"{self.name} is a plain objective; it has no data.")

    def loss(self, model: Any, batch: Any) -> Any:
        raise ConfigError(f"{self.name} is a plain objective; it has no loss.")
