"""Profiling: static accounting, memory, time, statistics and communication of a model's step.

Every part lands in one :class:`Profile` record that the rest of proftune reads.
"""

from __future__ import annotations

from ._record import (
    SCHEMA_VERSION,
    CommProfile,
    GradProfile,
    LayerProfile,
    MemoryProfile,
    ParamCounts,
    Profile,
    StepProfile,
    compare_profiles,
)
from ._static import LayerCount, StaticCounts, count_model, count_params

__all__ = [
    "SCHEMA_VERSION",
    "CommProfile",
    "GradProfile",
    "LayerCount",
    "LayerProfile",
    "MemoryProfile",
    "ParamCounts",
    "Profile",
    "StaticCounts",
    "StepProfile",
    "compare_profiles",
    "count_model",
    "count_params",
]
