"""proftune: compute the parameters of PyTorch models and their training from measurements."""

from __future__ import annotations

from ._api import TrainReport, run_train
# the function shadows its subpackage on purpose: proftune.compress(...) and
# `from proftune.compress import X` both work (the subpackage imports its modules eagerly)
from .compress import CompressConfig, CompressReport, compress
from .exceptions import ConfigError, ProftuneError, RunFailedError, TaskLoadError
from .task import ClassificationTask, Task, load_task
from .track import Store
from .train import Callback, FitResult, FitState, fit

__version__ = "0.1.0"

__all__ = [
    "Callback",
    "ClassificationTask",
    "CompressConfig",
    "CompressReport",
    "ConfigError",
    "FitResult",
    "FitState",
    "ProftuneError",
    "RunFailedError",
    "Store",
    "Task",
    "TaskLoadError",
    "TrainReport",
    "__version__",
    "compress",
    "fit",
    "load_task",
    "run_train",
]
