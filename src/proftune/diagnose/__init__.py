"""Diagnose training and adapt it while it runs: health checks, controllers, bandit allocation.

The subpackage imports its private modules eagerly; ``proftune.diagnose(...)`` (the function) is
bound in ``proftune/__init__.py`` next to this subpackage.
"""

from __future__ import annotations

from ._checks import HealthCheck
from ._controllers import AdaptiveLR, EarlyStopping, GradGuard
from ._findings import CAUSES, SEVERITIES, Finding, rank_findings
from ._lrtest import RangeTest, lr_range_test

__all__ = [
    "CAUSES",
    "SEVERITIES",
    "AdaptiveLR",
    "EarlyStopping",
    "Finding",
    "GradGuard",
    "HealthCheck",
    "RangeTest",
    "lr_range_test",
    "rank_findings",
]
