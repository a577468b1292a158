"""What a prediction of one training step is: the record :func:`proftune.predict.predict` returns.

Its concepts sit under :class:`proftune.Profile`'s names and nesting, so a prediction and a
measurement of the same step compare key by key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, cast

from .._jsonsafe import json_safe
from .._records import JsonRecord, stored_version
from ..exceptions import ConfigError
from ..profile import MemoryProfile, ParamCounts, UncountedOpEntry

__all__ = [
    "ESTIMATE_NOTE",
    "PREDICT_SCHEMA_VERSION",
    "Calibration",
    "ComputeSource",
    "LayerPrediction",
    "LinkUsed",
    "MaxBatchProbe",
    "MaxBatchSearch",
    "ParallelPlan",
    "ParallelPrediction",
    "PeakAt",
    "PredictResult",
    "PredictedMemory",
    "PredictedStep",
    "Rejected",
]

ESTIMATE_NOTE = ("time is a roofline estimate (max of FLOPs/peak and bytes/bandwidth per op, plus a "
                 "launch cost per op), not a measurement")


#: Bumped when a field of :class:`PredictResult`'s JSON changes meaning.
PREDICT_SCHEMA_VERSION = 3


class _AsDict:
    """A record whose JSON is its fields, every value made JSON-safe."""

    def to_dict(self) -> dict[str, Any]:
        return dict(json_safe(dataclasses.asdict(cast(Any, self))))


@dataclass(frozen=True)
class LayerPrediction(JsonRecord):
    """One layer (module path), by :class:`proftune.profile.LayerProfile`'s names: params, forward
    FLOPs (``flops``), activations saved, ms; and what only a trace has: backward FLOPs, the bytes
    its ops move and what bounds its estimated time."""

    WHAT: ClassVar[str] = "a layer's prediction"

    name: str
    type: str
    params: int
    #: Forward FLOPs of the layer's ops (the profile's ``flops``).
    flops: int
    backward_flops: int
    activation_bytes: int
    forward_ms: float | None
    backward_ms: float | None
    bytes_moved: int
    #: What bounds its estimated time: "compute", "memory" or "overhead" (many tiny ops).
    bound: str


@dataclass(frozen=True)
class PredictedMemory(MemoryProfile):
    """Bytes of the step: a :class:`proftune.profile.MemoryProfile`'s, and the parts a trace also
    separates: buffers, the batch, and ``static_bytes`` (what no batch size changes: parameters,
    buffers, gradients, optimizer state)."""

    buffers_bytes: int = 0
    batch_bytes: int = 0
    static_bytes: int = 0


@dataclass(frozen=True)
class PredictedStep:
    """Milliseconds of the step and its phases, by :class:`proftune.profile.StepProfile`'s names;
    a roofline estimate, None when the target's compute or bandwidth is unknown."""

    time_ms: float | None = None
    forward_ms: float | None = None
    backward_ms: float | None = None
    optimizer_ms: float | None = None


@dataclass(frozen=True)
class PeakAt:
    """Where the step's peak occurs: phase ("forward", "backward", "optimizer"), layer, op, and
    the live bytes by kind then (params, buffers, grads, optimizer_state, batch, activations,
    backward_temp, optimizer_temp; they add up to the peak)."""

    phase: str = ""
    layer: str = ""
    op: str = ""
    breakdown: dict[str, int] = field(default_factory=dict)


class LinkUsed(TypedDict, total=False):
    """The link a data-parallel step's collectives were priced with (bytes/s; None: unknown), whether
    they overlap the compute, where the figure comes from; measured: the collectives' own figures."""

    name: str
    bytes_s: float | None
    overlaps: bool
    source: str
    collectives_ms: dict[str, float]
    collectives: dict[str, dict[str, float]]


class ComputeSource(TypedDict, total=False):
    """Where a data-parallel step's compute figure comes from: ``name`` "measured" (one process's
    phases, ms, its threads and the ranks' ``sharing`` of the cores) or "roofline", and ``source``."""

    name: str
    source: str
    sharing: float
    device: str
    threads_per_rank: int
    cpu_share: float
    ranks_measured: int
    forward_ms: float
    backward_ms: float
    optimizer_ms: float


@dataclass(frozen=True)
class ParallelPrediction(_AsDict):
    """One GPU of a data-parallel run: bytes by kind at the step's peak, the model states, the
    largest per-GPU batch, the step's time with its collectives, and DeepSpeed's figure."""

    strategy: str
    gpus: int
    nodes: int
    activation_checkpointing: str
    offload: str
    #: Per-GPU micro-batch, micro-batches per step, and the global batch (samples).
    batch_size: int
    micro_batches: int
    global_batch: int
    #: Bytes one GPU holds at the step's peak, by kind (params, grads, optimizer_state,
    #: activations, backward_temp, comm_buckets, gathered_params, ...).
    memory: dict[str, int]
    peak_bytes: int
    peak_phase: str
    phase_peaks: dict[str, int]
    #: Bytes of parameters, gradients and optimizer state one GPU holds, and on its host.
    model_states: dict[str, int]
    activations_bytes: int
    activations_without_checkpointing_bytes: int
    comm_buffers_bytes: int
    device_memory_bytes: int | None
    fits: bool | None
    max_batch_size: int | None
    #: Milliseconds: compute (measured or roofline, as ``compute`` says; every micro-batch), the
    #: collectives in all, the part not hidden, the host traffic of offload, and the step.
    step: dict[str, float | None]
    samples_per_s: float | None
    tokens_per_s: float | None
    collectives: tuple[dict[str, Any], ...]
    link: LinkUsed
    deepspeed: dict[str, Any]
    n_params: int
    largest_layer_params: int
    note: str = ""
    #: Where the step's compute comes from: ``name`` measured (one process's phases, ms, and the
    #: ranks' ``sharing`` of the cores) or roofline, and ``source`` (empty in records before it).
    compute: ComputeSource = dataclasses.field(default_factory=ComputeSource)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ParallelPrediction:
        kw = _known(cls, d)
        kw["collectives"] = tuple(dict(c) for c in d.get("collectives") or ())
        return cls(**kw)


class Rejected(TypedDict):
    """A strategy mode with no per-GPU batch that fits: its smallest need and why (bytes per GPU)."""

    strategy: str
    activation_checkpointing: str
    offload: str
    needs_bytes: int
    batch_size: int
    reason: str


@dataclass(frozen=True)
class ParallelPlan(_AsDict):
    """Every strategy × checkpointing × offload × per-GPU batch that fits, best throughput first,
    and why each strategy that has no fitting option does not fit."""

    gpus: int
    nodes: int
    global_batch: int
    tokens_per_sample: int
    options: tuple[ParallelPrediction, ...]
    #: One entry per strategy (and mode) that fits at no per-GPU batch: its smallest need.
    rejected: tuple[Rejected, ...]
    traces: int
    seconds: float
    note: str = ("memory and time at per-GPU batches between the traced ones are the per-kind lines "
                 "through two traced batches; the best option is traced at its batch")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ParallelPlan:
        kw = _known(cls, d)
        kw["options"] = tuple(ParallelPrediction.from_dict(o) for o in d.get("options") or ())
        kw["rejected"] = tuple(dict(r) for r in d.get("rejected") or ())
        return cls(**kw)


class Calibration(TypedDict):
    """The prediction for this machine beside ``profile``'s measurement at ``batch_size``; the
    errors are predicted / measured - 1 (None where nothing was measured)."""

    batch_size: int
    device: str
    predicted_peak_bytes: int
    measured_peak_bytes: int
    peak_error: float | None
    predicted_step_ms: float
    measured_step_ms: float
    time_error: float | None
    real_steps: int


class MaxBatchProbe(TypedDict):
    """One fake step of the search for the largest batch: its peak bytes, "fits" or "over_budget",
    and its role ("probe", "verify", "bisect")."""

    batch_size: int
    peak_bytes: int
    status: str
    role: str


class MaxBatchSearch(TypedDict):
    """How the largest batch was found: the answer, the phase whose memory model bound it, the fake
    steps, that model (:class:`MemoryModel`'s JSON; None: none was fit) and a note."""

    max_batch_size: int
    binding_phase: str
    probes: list[MaxBatchProbe]
    model: dict[str, Any] | None
    note: str


@dataclass(frozen=True)
class PredictResult(_AsDict):
    """What one fake-traced training step predicts; bytes, ms, FLOPs. Zero real steps run.

    The concepts a :class:`proftune.Profile` also has sit under its names and nesting
    (``params.total``, ``memory.peak_bytes``, ``step.forward_ms``, ``layers[].flops``, ...), so a
    prediction and a measurement of one step compare key by key; what only a prediction has
    (the target, the roofline ``bound``, where the peak occurs, the largest batch) has its own keys.
    """

    task: str
    #: The device predicted for (the target's name), as a profile's ``device`` is where it measured.
    device: str
    batch_size: int
    precision: str
    optimizer: str
    target: dict[str, Any]
    params: ParamCounts
    #: FLOPs of the forward, backward and optimizer phases.
    flops: int
    backward_flops: int
    optimizer_flops: int
    memory: PredictedMemory
    step: PredictedStep
    layers: tuple[LayerPrediction, ...]
    #: What bounds the step's estimated time: "compute", "memory" or "unknown".
    bound: str
    peak: PeakAt
    uncounted_ops: tuple[UncountedOpEntry, ...]
    device_memory_bytes: int | None
    #: Whether the asked batch fits the device memory (None: no memory given).
    fits: bool | None
    #: The largest batch whose predicted peak (plus batch-size's safety margin) fits; 0: none.
    max_batch_size: int | None
    max_batch: MaxBatchSearch | None
    trace_s: float
    traces: int
    mode: str = "train"
    real_steps: int = 0
    #: With ``calibrate``: the same prediction for this machine's CPU beside ``profile``'s
    #: measurement there at a small batch (peak bytes and step ms, and their relative errors).
    calibration: Calibration | None = None
    #: The params the step was traced with (the task's defaults and the overrides).
    config: dict[str, Any] = field(default_factory=dict)
    note: str = ESTIMATE_NOTE
    traced_as: str = "cpu (fake tensors)"
    #: The Run this prediction was recorded as (None: not recorded).
    run_id: int | None = None
    #: With ``gpus``: one GPU of the data-parallel run (schema_version 3; None before).
    parallel: ParallelPrediction | None = None
    #: With ``plan``: the options that fit, best throughput first (schema_version 3; None before).
    plan: ParallelPlan | None = None
    schema_version: int = PREDICT_SCHEMA_VERSION

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PredictResult:
        """The record back from :meth:`to_dict`'s JSON (a Run's result, a saved file)."""
        version = stored_version(d, what="a prediction", current=PREDICT_SCHEMA_VERSION)
        if version < 2:  # version 1 was flat (peak_bytes, params an int); 3 added parallel and plan
            raise ConfigError(f"this JSON is not a proftune prediction of schema_version 2 or "
                              f"{PREDICT_SCHEMA_VERSION}: it has schema_version={version!r}.")
        kw = _known(cls, d)
        kw.update({key: _build(part, d.get(key) or {}) for key, part in
                   (("params", ParamCounts), ("memory", PredictedMemory), ("step", PredictedStep), ("peak", PeakAt))})
        kw["layers"] = tuple(_build(LayerPrediction, lay) for lay in d.get("layers") or [])
        kw["uncounted_ops"] = tuple(dict(u) for u in d.get("uncounted_ops") or ())
        kw["parallel"] = ParallelPrediction.from_dict(d["parallel"]) if d.get("parallel") else None
        kw["plan"] = ParallelPlan.from_dict(d["plan"]) if d.get("plan") else None
        return cls(**kw)


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """``d``'s values of ``cls``'s fields (a key it does not know is left out)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def _build(cls: type, d: dict[str, Any]) -> Any:
    return cls(**_known(cls, d))
