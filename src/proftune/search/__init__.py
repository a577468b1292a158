"""Constraint-aware, profile-gated hyperparameter search on Optuna.

``proftune.search(task, space, ...)`` is the entry point (bound in ``proftune/__init__.py``;
every private module is imported here eagerly so that the function keeps the name).
"""

from __future__ import annotations

from . import _analysis, _coarse_fine, _constraints, _gate, _pruners, _space, _study  # noqa: F401  (eager: see module doc)
from ._api import BACKENDS, SearchResult, search, task_metrics
from ._coarse_fine import CoarseToFineSampler
from ._constraints import PROFILE_METRICS, Constraint, Objective, parse_constraint, parse_objective
from ._gate import GateResult, ProfileGate
from ._pruners import PRUNERS, PatiencePruner
from ._ray import SCHEDULERS, RayOptions
from ._space import ForbidRule, Param, Space, load_space
from ._study import SAMPLERS, TrialRecord

__all__ = [
    "BACKENDS",
    "PROFILE_METRICS",
    "PRUNERS",
    "SAMPLERS",
    "SCHEDULERS",
    "CoarseToFineSampler",
    "Constraint",
    "ForbidRule",
    "GateResult",
    "Objective",
    "Param",
    "PatiencePruner",
    "ProfileGate",
    "RayOptions",
    "SearchResult",
    "Space",
    "TrialRecord",
    "load_space",
    "parse_constraint",
    "parse_objective",
    "search",
    "task_metrics",
]
