"""Profiling: static accounting, memory, time, statistics and communication of a model's step.

Every part lands in one :class:`Profile` record that the rest of proftune reads.
"""

from __future__ import annotations

from .._callable import make_callable as _make_callable
from ._api import ProfileConfig, profile
from ._comm import CommRecorder
from ._embeddings import (
    EMBEDDING_TYPES,
    IndexCounter,
    IndexStats,
    TableSpectrum,
    embedding_tables,
    index_stats,
    table_spectrum,
    zipf_exponent,
)
from ._inference import ForwardTiming, size_bytes, task_latencies, time_forwards
from ._layers import LayerHooks
from ._memory import (
    ActivationRecorder,
    PeakMemory,
    buffers_bytes,
    optimizer_state_bytes,
    params_bytes,
    peak_step_memory,
)
from ._monitor import Monitor
from ._ranks import (
    DDPPoint,
    DDPScaling,
    RankProfile,
    RanksResult,
    fit_scaling,
    profile_ddp_batches,
    profile_ranks,
)
from ._records import (
    SCHEMA_VERSION,
    CommProfile,
    GradProfile,
    LayerProfile,
    LayerStatistics,
    MemoryProfile,
    ParamCounts,
    Profile,
    StepProfile,
    UncountedOpEntry,
    compare_profiles,
    load_spread,
)
from ._static import (
    LayerCount,
    StaticCounts,
    UncountedOps,
    count_model,
    count_params,
    op_flops,
    uncounted_op,
)
from ._stats import LayerStats
from ._structure import (
    STRUCTURE_SCHEMA_VERSION,
    ModuleRow,
    Structure,
    model_and_input,
    model_structure,
)
from ._summaries import tensor_stats
from ._timing import LayerTimer
from ._watch import ScriptResult, Watcher, parse_command, run_script, watch

__all__ = [
    "EMBEDDING_TYPES",
    "SCHEMA_VERSION",
    "STRUCTURE_SCHEMA_VERSION",
    "ActivationRecorder",
    "CommProfile",
    "CommRecorder",
    "DDPPoint",
    "DDPScaling",
    "ForwardTiming",
    "GradProfile",
    "IndexCounter",
    "IndexStats",
    "LayerCount",
    "LayerHooks",
    "LayerProfile",
    "LayerStatistics",
    "LayerStats",
    "LayerTimer",
    "MemoryProfile",
    "ModuleRow",
    "Monitor",
    "ParamCounts",
    "PeakMemory",
    "Profile",
    "ProfileConfig",
    "RankProfile",
    "RanksResult",
    "ScriptResult",
    "StaticCounts",
    "StepProfile",
    "Structure",
    "TableSpectrum",
    "UncountedOpEntry",
    "UncountedOps",
    "Watcher",
    "buffers_bytes",
    "compare_profiles",
    "count_model",
    "count_params",
    "embedding_tables",
    "fit_scaling",
    "index_stats",
    "load_spread",
    "model_and_input",
    "model_structure",
    "op_flops",
    "optimizer_state_bytes",
    "params_bytes",
    "parse_command",
    "peak_step_memory",
    "profile",
    "profile_ddp_batches",
    "profile_ranks",
    "run_script",
    "size_bytes",
    "table_spectrum",
    "task_latencies",
    "tensor_stats",
    "time_forwards",
    "uncounted_op",
    "watch",
    "zipf_exponent",
]

# ``proftune.profile(task, ...)`` calls :func:`profile`: the subpackage is the one object of the name.
_make_callable(__name__)
