"""Constraint-aware, profile-gated hyperparameter search on Optuna.

``proftune.search(task, space, ...)`` is the entry point.
"""

from __future__ import annotations

from .._callable import make_callable as _make_callable
from .._deprecated import renamed
from .._optional import optuna  # noqa: F401  (missing: DependencyError naming the [search] extra)
from ._analysis import PLOT_FILES
from ._api import (
    DEFAULT_SCAN,
    cancel_waiting,
    feasibility_scan,
    search,
    study_trials,
    task_metrics,
)
from ._backends import (
    SEARCH_BACKEND_REGISTRY,
    SEARCH_BACKENDS,
    BackendRun,
    BaseSearchBackend,
    register_backend,
)
from ._coarse_fine import CoarseToFineSampler
from ._config import EnqueuedTrial, SearchConfig
from ._constraints import PROFILE_METRICS, Constraint, ConstraintCheck, Objective, parse_constraint, parse_objective
from ._feed import notify_ended
from ._gate import GateResult, ProfileGate
from ._objective import ObjectiveTask, load_objective
from ._pruners import PRUNER_REGISTRY, PRUNERS, BasePrunerMaker, PatiencePruner, register_pruner
from ._ray_session import SCHEDULERS, RayOptions
from ._records import TRIAL_SCHEMA_VERSION, TrialRecord, TrialResult
from ._result_records import SearchResult, TrialTally
from ._samplers import SAMPLER_REGISTRY, SAMPLERS, BaseSamplerMaker, register_sampler
from ._scan import Bound, ScanResult
from ._settings import SearchSettings
from ._space import ForbidRule, Param, Space, load_space
from ._storage import prepare_storage
from ._strategy import Statement, strategy

__all__ = [
    "DEFAULT_SCAN",
    "PLOT_FILES",
    "PROFILE_METRICS",
    "PRUNERS",
    "PRUNER_REGISTRY",
    "SAMPLERS",
    "SAMPLER_REGISTRY",
    "SCHEDULERS",
    "SEARCH_BACKENDS",
    "SEARCH_BACKEND_REGISTRY",
    "TRIAL_SCHEMA_VERSION",
    "BackendRun",
    "BasePrunerMaker",
    "BaseSamplerMaker",
    "BaseSearchBackend",
    "Bound",
    "CoarseToFineSampler",
    "Constraint",
    "ConstraintCheck",
    "EnqueuedTrial",
    "ForbidRule",
    "GateResult",
    "Objective",
    "ObjectiveTask",
    "Param",
    "PatiencePruner",
    "ProfileGate",
    "RayOptions",
    "ScanResult",
    "SearchConfig",
    "SearchResult",
    "SearchSettings",
    "Space",
    "Statement",
    "TrialRecord",
    "TrialResult",
    "TrialTally",
    "cancel_waiting",
    "feasibility_scan",
    "load_objective",
    "load_space",
    "notify_ended",
    "parse_constraint",
    "parse_objective",
    "prepare_storage",
    "register_backend",
    "register_pruner",
    "register_sampler",
    "search",
    "strategy",
    "study_trials",
    "task_metrics",
]

#: ``BACKENDS`` and ``scan``: former names of SEARCH_BACKENDS and feasibility_scan, deprecated.
__getattr__ = renamed(__name__, {"BACKENDS": "SEARCH_BACKENDS", "scan": "feasibility_scan"})

# ``proftune.search(...)`` calls :func:`search`: the subpackage is the one object of the name.
_make_callable(__name__)
