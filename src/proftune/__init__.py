"""proftune: compute the parameters of PyTorch models and their training from measurements."""

from __future__ import annotations

from ._api import TrainReport, run_train

# the function shadows its subpackage on purpose: proftune.compress(...) and
# `from proftune.compress import X` both work (the subpackage imports its modules eagerly)
from .compress import CompressConfig, CompressReport, compress
from .diagnose import AdaptiveLR, DiagnoseReport, EarlyStopping, GradGuard, HealthCheck, diagnose
from .exceptions import ConfigError, ProftuneError, RunFailedError, TaskLoadError
from .optimize import OptimizeConfig, OptimizeResult, optimize
from .profile import Monitor, Profile, profile
from .recommend import Recommendation, find_batch_size, lr_find, noise_scale, recommend
from .search import SearchResult, search
from .task import ClassificationTask, Task, load_task
from .track import Store
from .train import Callback, FitResult, FitState, fit

__version__ = "0.1.0"

__all__ = [
    "AdaptiveLR",
    "Callback",
    "ClassificationTask",
    "CompressConfig",
    "CompressReport",
    "ConfigError",
    "DiagnoseReport",
    "EarlyStopping",
    "FitResult",
    "FitState",
    "GradGuard",
    "HealthCheck",
    "Monitor",
    "OptimizeConfig",
    "OptimizeResult",
    "Profile",
    "ProftuneError",
    "Recommendation",
    "RunFailedError",
    "SearchResult",
    "Store",
    "Task",
    "TaskLoadError",
    "TrainReport",
    "__version__",
    "compress",
    "diagnose",
    "find_batch_size",
    "fit",
    "load_task",
    "lr_find",
    "noise_scale",
    "optimize",
    "profile",
    "recommend",
    "run_train",
    "search",
]
