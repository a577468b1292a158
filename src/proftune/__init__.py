"""proftune: compute the parameters of PyTorch models and their training from measurements."""

from __future__ import annotations

import os as _os
from typing import TYPE_CHECKING

# Set before torch loads its native libraries: their info and warning lines on stderr (c10's
# "[W ...] Memory block of unknown size...", kineto's "USDT: profiler_start" and, on a CUDA
# build without a GPU, "ERROR: gpuGetDeviceCount") are noise to a user. Errors still show;
# set TORCH_CPP_LOG_LEVEL / KINETO_LOG_LEVEL yourself to see the rest.
_os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
_os.environ.setdefault("KINETO_LOG_LEVEL", "6")

# they fill load_task's registries: the built-in task names, the adapters of Lightning, Hugging
# Face, bare nn.Modules and timm:NAME (task.py imports neither)
from . import examples as _examples  # noqa: F401
from . import integrations as _integrations  # noqa: F401
from ._api import TrainResult, run_train
from ._deprecated import renamed as _renamed
from .compress import CompressConfig, CompressResult
from .diagnose import (
    AdaptiveLR,
    BanditConfig,
    DiagnoseConfig,
    DiagnoseResult,
    EarlyStopping,
    GradGuard,
    HealthCheck,
)
from .exceptions import ConfigError, DependencyError, ProftuneError, RunFailedError, TaskLoadError
from .predict import PredictConfig, PredictResult
from .profile import Monitor, Profile, ProfileConfig, Watcher, watch
from .recommend import (
    BatchSizeConfig,
    LRFindConfig,
    Recommendation,
    RecommendConfig,
    find_batch_size,
    lr_find,
    noise_scale,
)
from .task import ClassificationTask, Task, load_task
from .track import Store
from .train import Callback, FitConfig, FitResult, FitState, TrainParams, fit

# proftune.profile, .compress, .diagnose, .recommend, .search and .optimize are the subpackages,
# callable as their function of the same name (_callable.py): `proftune.compress(task)`,
# `import proftune.compress as m` and `from proftune.compress import CompressConfig` reach one
# object. A type checker cannot call a module, so to it these names are the functions.
if TYPE_CHECKING:
    from .compress import compress
    from .diagnose import diagnose
    from .predict import predict
    from .profile import profile
    from .recommend import recommend
else:
    from . import compress, diagnose, predict, profile, recommend

try:
    from .optimize import OptimizeConfig, OptimizeResult
    from .search import SearchConfig, SearchResult

    if TYPE_CHECKING:
        from .optimize import optimize
        from .search import search
    else:
        from . import optimize, search
    # the pages register on import (the optimize page is one); ``proftune.report`` after ``import proftune``
    from . import report  # noqa: F401
except DependencyError as _missing_search:  # the [search] extra is not installed
    _MISSING: dict[str, str] = dict.fromkeys(
        ("SearchConfig", "SearchResult", "search", "OptimizeConfig", "OptimizeResult", "optimize"),
        str(_missing_search))
else:
    _MISSING = {}

__version__ = "0.1.0"


def _missing(name: str) -> object:
    """A public name whose optional dependency is missing raises the error naming its extra."""
    if name in _MISSING:
        raise DependencyError(_MISSING[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Former names, deprecated: ``TrainReport`` (TrainResult), ``DiagnoseReport`` (DiagnoseResult).
__getattr__ = _renamed(__name__, {"TrainReport": "TrainResult", "DiagnoseReport": "DiagnoseResult",
                                     "CompressReport": "CompressResult"}, fallback=_missing)

__all__ = [
    "AdaptiveLR",
    "BanditConfig",
    "BatchSizeConfig",
    "Callback",
    "ClassificationTask",
    "CompressConfig",
    "CompressResult",
    "ConfigError",
    "DependencyError",
    "DiagnoseConfig",
    "DiagnoseResult",
    "EarlyStopping",
    "FitConfig",
    "FitResult",
    "FitState",
    "GradGuard",
    "HealthCheck",
    "LRFindConfig",
    "Monitor",
    "OptimizeConfig",
    "OptimizeResult",
    "PredictConfig",
    "PredictResult",
    "Profile",
    "ProfileConfig",
    "ProftuneError",
    "RecommendConfig",
    "Recommendation",
    "RunFailedError",
    "SearchConfig",
    "SearchResult",
    "Store",
    "Task",
    "TaskLoadError",
    "TrainParams",
    "TrainResult",
    "Watcher",
    "__version__",
    "compress",
    "diagnose",
    "find_batch_size",
    "fit",
    "load_task",
    "lr_find",
    "noise_scale",
    "optimize",
    "predict",
    "profile",
    "recommend",
    "run_train",
    "search",
    "watch",
]
