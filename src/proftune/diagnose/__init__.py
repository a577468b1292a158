"""Diagnose training and adapt it while it runs: health checks, controllers, bandit allocation.

The subpackage imports its private modules eagerly; ``proftune.diagnose(...)`` (the function) is
bound in ``proftune/__init__.py`` next to this subpackage.
"""

from __future__ import annotations

from ._api import (
    BanditReport,
    DiagnoseReport,
    bandit,
    check_arms,
    diagnose,
    known_params,
    load_configs,
)
from ._bandit import POLICIES, Arm, ArmStats, Bandit, BanditPulls, SimResult, regret_curve, simulate
from ._checks import HealthCheck
from ._controllers import AdaptiveLR, EarlyStopping, GradGuard
from ._findings import CAUSES, SEVERITIES, Finding, rank_findings
from ._lrtest import RangeTest, lr_range_test

__all__ = [
    "CAUSES",
    "POLICIES",
    "SEVERITIES",
    "AdaptiveLR",
    "Arm",
    "ArmStats",
    "Bandit",
    "BanditPulls",
    "BanditReport",
    "DiagnoseReport",
    "EarlyStopping",
    "Finding",
    "GradGuard",
    "HealthCheck",
    "RangeTest",
    "SimResult",
    "bandit",
    "check_arms",
    "diagnose",
    "known_params",
    "load_configs",
    "lr_range_test",
    "rank_findings",
    "regret_curve",
    "simulate",
]
