"""Diagnose training and adapt it while it runs: health checks, controllers, bandit allocation.

``proftune.diagnose(task, ...)`` is the entry point.
"""

from __future__ import annotations

from .._callable import make_callable as _make_callable
from .._deprecated import renamed
from ..train import EarlyStopping
from ._api import (
    BanditConfig,
    DiagnoseConfig,
    bandit,
    check_arms,
    diagnose,
    known_params,
    load_configs,
)
from ._bandit import POLICIES, Arm, ArmStats, Bandit, BanditPulls, SimResult, regret_curve, simulate
from ._controllers import AdaptiveLR, GradGuard
from ._findings import CAUSES, SEVERITIES, Finding, flatten_findings, rank_findings
from ._health import HealthCheck
from ._history import History, StepRecord
from ._lrtest import RangeTest, lr_range_test
from ._records import ArmResult, BanditPull, BanditResult, DiagnoseResult
from .checks import CHECKS, BaseCheck, register_check

__all__ = [
    "CAUSES",
    "CHECKS",
    "POLICIES",
    "SEVERITIES",
    "AdaptiveLR",
    "Arm",
    "ArmResult",
    "ArmStats",
    "Bandit",
    "BanditConfig",
    "BanditPull",
    "BanditPulls",
    "BanditResult",
    "BaseCheck",
    "DiagnoseConfig",
    "DiagnoseResult",
    "EarlyStopping",
    "Finding",
    "GradGuard",
    "HealthCheck",
    "History",
    "RangeTest",
    "SimResult",
    "StepRecord",
    "bandit",
    "check_arms",
    "diagnose",
    "flatten_findings",
    "known_params",
    "load_configs",
    "lr_range_test",
    "rank_findings",
    "register_check",
    "regret_curve",
    "simulate",
]

#: ``DiagnoseReport`` and ``BanditReport``: former names of DiagnoseResult and BanditResult, deprecated.
__getattr__ = renamed(__name__, {"DiagnoseReport": "DiagnoseResult", "BanditReport": "BanditResult"})

# ``proftune.diagnose(...)`` calls :func:`diagnose`: the subpackage is the one object of the name.
_make_callable(__name__)
