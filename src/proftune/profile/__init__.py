"""Profiling: static accounting, memory, time, statistics and communication of a model's step.

Every part lands in one :class:`Profile` record that the rest of proftune reads.
"""

from __future__ import annotations

from ._comm import CommRecorder
from ._memory import ActivationRecorder, PeakMemory, peak_step_memory
from ._monitor import Monitor
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
from ._stats import LayerStats, tensor_stats
from ._timing import LayerTimer

__all__ = [
    "SCHEMA_VERSION",
    "ActivationRecorder",
    "CommProfile",
    "CommRecorder",
    "GradProfile",
    "LayerCount",
    "LayerProfile",
    "LayerStats",
    "LayerTimer",
    "MemoryProfile",
    "Monitor",
    "ParamCounts",
    "PeakMemory",
    "Profile",
    "StaticCounts",
    "StepProfile",
    "compare_profiles",
    "count_model",
    "count_params",
    "peak_step_memory",
    "tensor_stats",
]
