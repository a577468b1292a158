"""Predict the memory and time of one training step without running it: fake tensors.

The task's model is built on the meta device and its parameters, buffers and a batch of the
asked size become fake tensors (``torch._subclasses.fake_tensor.FakeTensorMode``): every op of
one training step (forward, backward, optimizer step, as the fit loop runs it) runs its shape
rules only, nothing is allocated, so a 7B-parameter model is traced on a laptop.

Memory follows the storages the step creates and frees, as ``torch.distributed._tools.
MemTracker`` does (a dispatch mode, a weak reference per storage whose release subtracts its
bytes): parameters, buffers, gradients, optimizer state and the batch are live from the start;
the running sum peaks at the step's peak, the same definition as the profiler's measured peak.
We keep our own small tracker rather than MemTracker because MemTracker walks every module it
has seen after each op (a 7B step took > 5 min), and attribute backward ops to layers through
the autograd node being run (``ModTracker``'s backward state is too coarse for that).

Time is a roofline estimate per op: max(FLOPs / peak compute, bytes read+written / bandwidth)
plus a fixed launch cost per op, on the target's numbers (:mod:`._devices`). FLOPs come from
the one FLOP counter's formulas (:func:`proftune.profile.op_flops`); ops that do arithmetic the
formulas cannot count are listed (``uncounted_ops``), never counted as 0 in silence.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.weak import WeakIdKeyDictionary

from .._device import batch_size_of, resolve_device
from .._jsonsafe import json_safe
from .._options import with_options
from .._units import format_bytes
from ..exceptions import ConfigError
from ..profile import LayerHooks, ParamCounts, UncountedOps, op_flops, uncounted_op
from ..task import Task, load_task
from ..track import Store, optional_store, tracked_run
from ..train import validate_params
from ._batch_size import MIN_MARGIN_FRACTION, MemoryModel, fit_memory_model
from ._devices import DeviceSpec, resolve_target, roofline_ms

__all__ = [
    "PREDICT_SCHEMA_VERSION",
    "LayerPrediction",
    "PeakAt",
    "PredictConfig",
    "PredictResult",
    "PredictedMemory",
    "PredictedStep",
    "StepTracer",
    "predict",
]

log = logging.getLogger(__name__)

#: Batch size of the real sample batch whose structure the fake batch copies.
_SAMPLE_BATCH = 3
_PHASES = ("forward", "backward", "optimizer")
_LOW = {torch.bfloat16: "bf16", torch.float16: "fp16"}
ESTIMATE_NOTE = ("time is a roofline estimate (max of FLOPs/peak and bytes/bandwidth per op, plus a "
                 "launch cost per op), not a measurement")


# -- records ---------------------------------------------------------------------------------------


#: Bumped when a field of :class:`PredictResult`'s JSON changes meaning.
PREDICT_SCHEMA_VERSION = 2


@dataclass(frozen=True)
class LayerPrediction:
    """One layer (module path), by :class:`proftune.profile.LayerProfile`'s names: params, forward
    FLOPs (``flops``), activations saved, ms; and what only a trace has: backward FLOPs, the bytes
    its ops move and what bounds its estimated time."""

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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PredictedMemory:
    """Bytes of the step, by :class:`proftune.profile.MemoryProfile`'s names, and the parts a trace
    also separates: buffers, the batch, and ``static_bytes`` (what no batch size changes:
    parameters, buffers, gradients, optimizer state)."""

    params_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    #: Bytes autograd saves for backward (the activations), all layers.
    activations_bytes: int = 0
    peak_bytes: int = 0
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


@dataclass(frozen=True)
class PredictResult:
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
    uncounted_ops: tuple[dict[str, Any], ...]
    device_memory_bytes: int | None
    #: Whether the asked batch fits the device memory (None: no memory given).
    fits: bool | None
    #: The largest batch whose predicted peak (plus batch-size's safety margin) fits; 0: none.
    max_batch_size: int | None
    max_batch: dict[str, Any] | None
    trace_s: float
    traces: int
    mode: str = "train"
    real_steps: int = 0
    #: With ``calibrate``: the same prediction for this machine's CPU beside ``profile``'s
    #: measurement there at a small batch (peak bytes and step ms, and their relative errors).
    calibration: dict[str, Any] | None = None
    #: The params the step was traced with (the task's defaults and the overrides).
    config: dict[str, Any] = field(default_factory=dict)
    note: str = ESTIMATE_NOTE
    traced_as: str = "cpu (fake tensors)"
    #: The Run this prediction was recorded as (None: not recorded).
    run_id: int | None = None
    schema_version: int = PREDICT_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dict(json_safe(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PredictResult:
        """The record back from :meth:`to_dict`'s JSON (a Run's result, a saved file)."""
        if not isinstance(d, dict):
            raise ConfigError(f"a prediction must be a JSON object, but got {type(d).__name__}.")
        version = d.get("schema_version")
        if not isinstance(version, int) or version < PREDICT_SCHEMA_VERSION:
            raise ConfigError(f"this JSON is not a proftune prediction of schema_version "
                              f"{PREDICT_SCHEMA_VERSION}: it has schema_version={version!r}.")
        if version > PREDICT_SCHEMA_VERSION:
            raise ConfigError(f"prediction schema_version={version} is newer than this proftune reads "
                              f"({PREDICT_SCHEMA_VERSION}); upgrade proftune.")
        known = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in known}
        kw["params"] = _build(ParamCounts, d.get("params") or {})
        kw["memory"] = _build(PredictedMemory, d.get("memory") or {})
        kw["step"] = _build(PredictedStep, d.get("step") or {})
        kw["peak"] = _build(PeakAt, d.get("peak") or {})
        kw["layers"] = tuple(_build(LayerPrediction, lay) for lay in d.get("layers") or [])
        kw["uncounted_ops"] = tuple(dict(u) for u in d.get("uncounted_ops") or ())
        return cls(**kw)


def _build(cls: type, d: dict[str, Any]) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})


# -- fake model and batch ------------------------------------------------------------------------------


def _build_meta(task: Task, params: dict[str, Any]) -> nn.Module:
    """The task's model built on the meta device: no parameter is allocated."""
    try:
        with torch.device("meta"):
            return task.build_model(params)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
        # a builder that copies real data into its weights cannot build on meta: build for real
        log.info("building %s on the meta device failed (%s); building it on the CPU", task.name, exc)
        return task.build_model(params)


def _fake_like(t: torch.Tensor, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """A fake tensor (the active FakeTensorMode) with ``t``'s dtype on the CPU."""
    return torch.empty(shape if shape is not None else tuple(t.shape), dtype=t.dtype, device="cpu")


def _fake_parameters(model: nn.Module) -> None:
    """Swap every parameter and buffer for a fake CPU tensor of its shape (shared ones stay shared)."""
    memo: dict[int, Any] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                memo[id(p)] = nn.Parameter(_fake_like(p), requires_grad=p.requires_grad)
            mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is None:
                continue
            if id(b) not in memo:
                memo[id(b)] = _fake_like(b)
            mod._buffers[name] = memo[id(b)]


def _sample_batch(task: Task, params: dict[str, Any]) -> Any:
    for batch in task.train_data(_SAMPLE_BATCH, params):
        return batch
    raise ConfigError(f"{task.name or type(task).__name__}.train_data({_SAMPLE_BATCH}) yielded no batch.")


def _fake_batch(sample: Any, batch_size: int) -> Any:
    """The sample batch's structure at ``batch_size``: every tensor whose first dimension is the
    sample's batch size grows to ``batch_size``; fake, so nothing is allocated."""
    n = batch_size_of(sample)
    leaves, spec = tree_flatten(sample)
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            shape = tuple(leaf.shape)
            if leaf.dim() > 0 and shape[0] == n:
                shape = (batch_size, *shape[1:])
            out.append(_fake_like(leaf, shape))
        else:
            out.append(leaf)
    return tree_unflatten(out, spec)


# -- the tracker --------------------------------------------------------------------------------------


def _storages(value: Any) -> Iterator[torch.UntypedStorage]:
    leaves, _ = tree_flatten(value)
    for t in leaves:
        if isinstance(t, torch.Tensor):
            yield t.untyped_storage()


def _tensor_bytes(t: torch.Tensor) -> int:
    """Bytes an op reads or writes of ``t`` (a broadcast dimension, stride 0, counts once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=False):
        if stride != 0:
            n *= int(size)
    return n * t.element_size()


@dataclass
class _OpRecord:
    layer: str
    phase: str
    flops: int
    nbytes: int
    compute: str  # "fp32" | "bf16" | "fp16"


@dataclass
class _Trace:
    peak: int = 0
    #: The highest live bytes within each phase.
    phase_peaks: dict[str, int] = field(default_factory=dict)
    peak_where: tuple[str, str, str] = ("", "", "")
    peak_breakdown: dict[str, int] = field(default_factory=dict)
    ops: list[_OpRecord] = field(default_factory=list)
    activations: dict[str, int] = field(default_factory=dict)
    uncounted: dict[str, dict[str, Any]] = field(default_factory=dict)
    layer_types: dict[str, str] = field(default_factory=dict)
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    static: dict[str, int] = field(default_factory=dict)


class _StepTracker(TorchDispatchMode):
    """Live bytes by kind, the running peak and where it happens; per op FLOPs and bytes."""

    def __init__(self, layer_of: Callable[[], str]) -> None:
        super().__init__()
        self.layer_of = layer_of
        self.phase = "setup"
        self.live: dict[str, int] = defaultdict(int)
        self.total = 0
        self.info: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.trace = _Trace()
        self.uncounted = UncountedOps()

    # bookkeeping of storages
    def track(self, st: torch.UntypedStorage, kind: str) -> None:
        entry = self.info.get(st)
        if entry is not None:
            if entry[0] != kind and kind in ("grads", "optimizer_state"):
                self.live[entry[0]] -= entry[1]
                self.live[kind] += entry[1]
                entry[0] = kind
            return
        nbytes = int(st.nbytes())
        entry = [kind, nbytes]
        self.info[st] = entry
        self.live[kind] += nbytes
        self.total += nbytes
        weakref.finalize(st, self._release, entry)

    def _release(self, entry: list[Any]) -> None:
        self.live[entry[0]] -= entry[1]
        self.total -= entry[1]

    def track_all(self, value: Any, kind: str) -> None:
        for st in _storages(value):
            self.track(st, kind)

    def _update_peak(self, op: str) -> None:
        if self.total > self.trace.phase_peaks.get(self.phase, 0):
            self.trace.phase_peaks[self.phase] = self.total
        if self.total > self.trace.peak:
            self.trace.peak = self.total
            self.trace.peak_where = (self.phase, self.layer_of(), op)
            self.trace.peak_breakdown = {k: v for k, v in self.live.items() if v}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.phase in ("setup", "done"):
            return out
        kind = {"forward": "activations", "backward": "backward_temp"}.get(self.phase, "optimizer_temp")
        self.track_all(out, kind)
        self._update_peak(str(func._overloadpacket.__name__))
        if getattr(func, "is_view", False):
            return out
        flops = op_flops(func, args, kwargs, out)
        if flops is None:
            flops = 0
            if uncounted_op(func):
                self.uncounted.add(func, args, kwargs)
        leaves, _ = tree_flatten((args, kwargs, out))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        nbytes = sum(_tensor_bytes(t) for t in tensors)
        compute = "fp32"
        for t in tensors:
            if t.dtype in _LOW:
                compute = _LOW[t.dtype]
                break
        self.trace.ops.append(_OpRecord(self.layer_of(), self.phase, flops, nbytes, compute))
        return out


# -- tracing one step --------------------------------------------------------------------------------


def _metadata(node: Any) -> dict[str, Any]:
    """An autograd node's metadata dict (kept on the C++ node, so it outlives the Python wrapper)."""
    meta: dict[str, Any] = node.metadata
    return meta


class _LayerStack:
    """Which layer (module path) runs now: in forward, the innermost module of the profiler's
    own :class:`~proftune.profile.LayerHooks`; in backward, the forward layer of the autograd
    node being run (tagged on the node's metadata by a TorchFunctionMode in forward).
    ``ModTracker``'s backward state is a set of modules whose grads are pending, too coarse to
    tell which layer a backward op belongs to.
    """

    KEY = "proftune_layer"

    def __init__(self, model: nn.Module) -> None:
        self.hooks = LayerHooks(model)
        self.backward = False

    def current(self) -> str:
        if self.backward:
            node = torch._C._current_autograd_node()
            if node is not None:
                return str(_metadata(node).get(self.KEY, ""))
            return ""
        return self.hooks.current or ""

    def __enter__(self) -> _LayerStack:
        self.hooks.attach()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hooks.detach()


class _TagNodes(torch.overrides.TorchFunctionMode):
    """Forward: tag the autograd node of every op's output with the layer that ran it."""

    def __init__(self, layers: _LayerStack) -> None:
        super().__init__()
        self.layers = layers

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        layer = self.layers.hooks.current
        if layer is not None:
            leaves, _ = tree_flatten(out)
            for t in leaves:
                node = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
                if node is not None:
                    _metadata(node).setdefault(_LayerStack.KEY, layer)
        return out


def _autocast(precision: str) -> contextlib.AbstractContextManager[Any]:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of state tensors, the 0-d step counters left out (the Profile's definition)."""
    total = 0
    seen: set[int] = set()
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not (key == "step" and value.dim() == 0):
                st = value.untyped_storage()
                if id(st) not in seen:
                    seen.add(id(st))
                    total += int(st.nbytes())
    return total


def _unique_bytes(tensors: Any) -> int:
    seen: set[int] = set()
    total = 0
    for st in _storages(list(tensors)):
        if id(st) not in seen:
            seen.add(id(st))
            total += int(st.nbytes())
    return total


class StepTracer:
    """Traces training steps of one task under fake tensors; the model is built once (on the
    meta device, then faked) and every :meth:`trace` runs one step at a batch size, as the fit
    loop runs it: zero_grad(set_to_none), forward and loss under autocast, backward, clip,
    optimizer step, its state created first by a step on zero gradients (as after warm-up).

    ``foreach`` uses the multi-tensor optimizer kernels (PyTorch's default on CUDA).
    """

    def __init__(self, task: Task, params: dict[str, Any], *, precision: str = "fp32",
                 foreach: bool = False) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        if params.get("optimizer") == "lbfgs":
            raise ConfigError("predict does not support optimizer='lbfgs' (its step re-runs the model "
                              "a data-dependent number of times); valid: adamw, adam, sgd.")
        self.task, self.params, self.precision, self.foreach = task, params, precision, foreach
        self.sample = _sample_batch(task, params)
        model = _build_meta(task, params)
        seen: set[int] = set()
        self.layer_params: dict[str, int] = {}
        self.layer_types: dict[str, str] = {}
        self.n_trainable = 0
        for name, mod in model.named_modules():
            self.layer_types[name] = type(mod).__name__
            n = 0
            for p in mod.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    n += p.numel()
                    self.n_trainable += p.numel() if p.requires_grad else 0
            if n:
                self.layer_params[name] = n
        self.n_params = sum(self.layer_params.values())
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        with self.fake_mode:
            _fake_parameters(model)
        self.model = model
        self.traces = 0
        #: Traces by batch size (a trace depends on nothing else).
        self.cache: dict[int, _Trace] = {}

    def trace(self, batch_size: int) -> _Trace:
        model, params = self.model, self.params
        layers = _LayerStack(model)
        tracker = _StepTracker(layers.current)
        tracker.trace.layer_types = self.layer_types
        activations: dict[str, int] = defaultdict(int)
        self.traces += 1
        with self.fake_mode:
            model.train()
            batch = _fake_batch(self.sample, batch_size)
            optimizer = self.task.configure_optimizer(model, params)
            if self.foreach:
                for group in optimizer.param_groups:
                    if "foreach" in group and group["foreach"] is None:
                        group["foreach"] = True
            trainable = [p for p in model.parameters() if p.requires_grad]
            for p in trainable:
                p.grad = torch.zeros_like(p)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            param_storages = WeakIdKeyDictionary()
            for p in model.parameters():
                param_storages[p.untyped_storage()] = True
            tracker.track_all(list(model.parameters()), "params")
            tracker.track_all(list(model.buffers()), "buffers")
            tracker.track_all(_optimizer_state_tensors(optimizer), "optimizer_state")
            tracker.track_all(batch, "batch")
            static = {"params_bytes": _unique_bytes(model.parameters()),
                      "buffers_bytes": _unique_bytes(model.buffers()),
                      "batch_bytes": _unique_bytes(tree_flatten(batch)[0])}
            saved = WeakIdKeyDictionary()

            def pack(t: torch.Tensor) -> torch.Tensor:
                st = t.untyped_storage()
                if st in param_storages or st in saved:
                    return t
                saved[st] = True
                activations[tracker.layer_of()] += int(st.nbytes())
                return t

            def unpack(t: torch.Tensor) -> torch.Tensor:
                return t

            def on_grad(p: torch.Tensor) -> None:
                if p.grad is not None:
                    tracker.track(p.grad.untyped_storage(), "grads")

            hooks = [p.register_post_accumulate_grad_hook(on_grad) for p in trainable]
            try:
                with layers, tracker:
                    tracker.phase = "forward"
                    with (torch.autograd.graph.saved_tensors_hooks(pack, unpack), _autocast(self.precision),
                          _TagNodes(layers)):
                        loss = self.task.loss(model, batch)
                    tracker.phase = "backward"
                    layers.backward = True
                    loss.backward()
                    layers.backward = False
                    del loss
                    tracker.phase = "optimizer"
                    clip = params.get("grad_clip")
                    if clip:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), float(clip))
                    optimizer.step()
                    tracker.phase = "done"
                    tracker.track_all(_optimizer_state_tensors(optimizer), "optimizer_state")
            finally:
                for h in hooks:
                    h.remove()
            trace = tracker.trace
            trace.grads_bytes = _unique_bytes(p.grad for p in trainable if p.grad is not None)
            trace.optimizer_bytes = _optimizer_state_bytes(optimizer)
            for p in trainable:
                p.grad = None
            del optimizer, batch
        trace.activations = dict(activations)
        trace.uncounted = tracker.uncounted.ops
        trace.static = static
        return trace


def _optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


# -- from a trace to a prediction ----------------------------------------------------------------------


def _roofline(trace: _Trace, spec: DeviceSpec) -> tuple[dict[str, dict[str, Any]], dict[str, float | None], str]:
    """Per layer and per phase: FLOPs, bytes, estimated ms, and the bound."""
    layers: dict[str, dict[str, Any]] = {}
    phases: dict[str, list[float]] = {p: [0.0, 0.0, 0.0] for p in _PHASES}  # compute s, memory s, ms
    known = bool(spec.bandwidth_bytes_s) and bool(spec.peak_tflops)
    for op in trace.ops:
        tflops = spec.tflops(op.compute)
        ms, _ = roofline_ms(op.flops, op.nbytes, tflops=tflops, bandwidth=spec.bandwidth_bytes_s,
                            ops=1, overhead_us=spec.op_overhead_us)
        entry = layers.setdefault(op.layer, {"forward_flops": 0, "backward_flops": 0, "bytes": 0,
                                             "forward_ms": 0.0, "backward_ms": 0.0, "compute_s": 0.0,
                                             "memory_s": 0.0, "overhead_s": 0.0})
        if op.phase in ("forward", "backward"):
            entry[f"{op.phase}_flops"] += op.flops
            entry["bytes"] += op.nbytes
            entry[f"{op.phase}_ms"] += ms or 0.0
        if known and tflops:
            c, m = op.flops / (tflops * 1e12), op.nbytes / float(spec.bandwidth_bytes_s or 1)
            entry["compute_s"] += c
            entry["memory_s"] += m
            entry["overhead_s"] += spec.op_overhead_us * 1e-6
            acc = phases[op.phase]
            acc[0] += c
            acc[1] += m
            acc[2] += ms or 0.0
    phase_ms: dict[str, float | None] = {p: (phases[p][2] if known else None) for p in _PHASES}
    comp = sum(v[0] for v in phases.values())
    mem = sum(v[1] for v in phases.values())
    bound = "unknown" if not known else ("compute" if comp >= mem else "memory")
    return layers, phase_ms, bound


def _bound(entry: dict[str, Any]) -> str:
    c, m, o = entry["compute_s"], entry["memory_s"], entry["overhead_s"]
    if c == m == o == 0:
        return "unknown"
    if o > max(c, m):
        return "overhead"
    return "compute" if c >= m else "memory"


def _assemble(trace: _Trace, spec: DeviceSpec, tracer: StepTracer) -> dict[str, Any]:
    """The parts of a prediction that one trace on one target gives: counts, memory, time, layers."""
    layer_costs, phase_ms, bound = _roofline(trace, spec)
    names = [n for n in trace.layer_types if n in layer_costs or n in trace.activations]
    names += [n for n in layer_costs if n not in names]
    layers = []
    for name in names:
        e = layer_costs.get(name)
        known = e is not None and bool(spec.bandwidth_bytes_s)
        layers.append(LayerPrediction(
            name=name, type=trace.layer_types.get(name, "?"), params=tracer.layer_params.get(name, 0),
            flops=int(e["forward_flops"]) if e else 0,
            backward_flops=int(e["backward_flops"]) if e else 0,
            activation_bytes=int(trace.activations.get(name, 0)),
            forward_ms=float(e["forward_ms"]) if (e and known) else None,
            backward_ms=float(e["backward_ms"]) if (e and known) else None,
            bytes_moved=int(e["bytes"]) if e else 0,
            bound=_bound(e) if (e and known) else "unknown",
        ))
    flops = {p: sum(op.flops for op in trace.ops if op.phase == p) for p in _PHASES}
    total_ms = sum(v for v in phase_ms.values() if v is not None) if phase_ms["forward"] is not None else None
    st = trace.static
    static = st["params_bytes"] + st["buffers_bytes"] + trace.grads_bytes + trace.optimizer_bytes
    return {
        "params": ParamCounts(total=tracer.n_params, trainable=tracer.n_trainable),
        "flops": flops["forward"], "backward_flops": flops["backward"], "optimizer_flops": flops["optimizer"],
        "memory": PredictedMemory(
            params_bytes=st["params_bytes"], grads_bytes=trace.grads_bytes, optimizer_bytes=trace.optimizer_bytes,
            activations_bytes=sum(trace.activations.values()), peak_bytes=trace.peak,
            buffers_bytes=st["buffers_bytes"], batch_bytes=st["batch_bytes"], static_bytes=static),
        "step": PredictedStep(time_ms=total_ms, forward_ms=phase_ms["forward"], backward_ms=phase_ms["backward"],
                              optimizer_ms=phase_ms["optimizer"]),
        "layers": tuple(layers), "bound": bound,
        "peak": PeakAt(phase=trace.peak_where[0], layer=trace.peak_where[1], op=trace.peak_where[2],
                       breakdown=dict(trace.peak_breakdown)),
        "uncounted_ops": tuple(dict(u) for u in trace.uncounted.values()),
    }


def _validate(batch_size: Any, precision: str) -> None:
    from ..exceptions import ProblemCollector

    problems = ProblemCollector()
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        problems.add(f"batch_size must be a positive integer, but got {batch_size=}.")
    if precision not in ("fp32", "bf16", "fp16"):
        problems.add(f"precision={precision!r} is unknown; valid: fp32, bf16, fp16.")
    problems.raise_if_any()


@dataclass(frozen=True)
class PredictConfig:
    """What one prediction asks: the batch, the device predicted FOR (``target`` and the numbers
    that override or describe it), the step's settings, and where proftune itself runs.

    ``target`` names a device (``h200``, ``h100``, ``a100``, ``v100``, ``l4``, ``t4``, ``cpu`` =
    this machine; ``auto``: ``device``'s (this machine's CUDA device when ``device`` resolves to
    one, else its CPU), or with only numbers given, a device of those numbers); ``device_memory``
    (bytes or ``80GiB``), ``peak_tflops`` and ``bandwidth`` (bytes/s or ``3.35TB``) override its
    numbers or describe another device. ``precision`` and ``optimizer`` override the task's
    params. With ``max_batch`` and a known memory, the largest batch that fits is searched as
    ``batch-size`` searches it (the same memory model and margin), on fake steps: zero real
    steps. ``foreach`` traces the optimizer's multi-tensor kernels (default: on a GPU target, as
    PyTorch does on CUDA). ``calibrate=b`` also profiles ``b``-sample steps on ``device`` (real
    steps) and reports the error of the same prediction made for it.
    """

    batch_size: int = 0
    target: str | None = "auto"
    device_memory: int | str | None = None
    peak_tflops: float | None = None
    bandwidth: float | str | None = None
    precision: str | None = None
    optimizer: str | None = None
    max_batch: bool = True
    foreach: bool | None = None
    calibrate: int | None = None
    device: str | torch.device = "auto"


def predict(
    task: Task | str,
    params: dict[str, Any] | None = None,
    config: PredictConfig | None = None,
    *,
    store: Store | str | None = None,
    db: str | None = None,
    **options: Any,
) -> PredictResult:
    """Predict one training step of ``task`` without running it (see :class:`PredictConfig`).

    ``config`` says what to predict; ``options`` set its fields by name
    (``predict("digits-cnn", batch_size=256, target="a100", precision="bf16")``). With ``store``
    (a :class:`Store` or a URL; ``db`` is the older spelling) the prediction is recorded as a Run
    of kind ``predict`` whose result is :meth:`PredictResult.to_dict`.
    """
    cfg = with_options(PredictConfig, config, options, caller="predict")
    batch_size, target, device_memory = cfg.batch_size, cfg.target, cfg.device_memory
    peak_tflops, bandwidth, precision, optimizer = cfg.peak_tflops, cfg.bandwidth, cfg.precision, cfg.optimizer
    max_batch, foreach, calibrate, device = cfg.max_batch, cfg.foreach, cfg.calibrate, cfg.device
    task_obj = load_task(task)
    merged = dict(task_obj.default_params)
    merged.update(params or {})
    if precision is not None:
        merged["precision"] = precision
    if optimizer is not None:
        merged["optimizer"] = optimizer
    merged = validate_params(merged)
    prec = str(merged.get("precision", "fp32"))
    _validate(batch_size, prec)
    if calibrate is not None and (isinstance(calibrate, bool) or not isinstance(calibrate, int) or calibrate < 1):
        raise ConfigError(f"calibrate must be a positive batch size, but got {calibrate=}.")
    dev = resolve_device(device)
    name = (target or "").strip().lower()
    if name == "auto":
        # numbers given without a name describe another device; else the one proftune runs on
        given = device_memory is not None or peak_tflops is not None or bandwidth is not None
        name = "" if given else _local_target(dev)
    spec = resolve_target(name or None, memory=device_memory, peak_tflops=peak_tflops, bandwidth=bandwidth)
    st = optional_store(store, db=db)
    if st is None:
        return _predict(task_obj, merged, prec, spec, batch_size, max_batch=max_batch, foreach=foreach,
                        calibrate=calibrate, dev=dev)
    run_config = {"params": merged, "batch_size": batch_size, "target": spec.to_dict(), "max_batch": max_batch,
                  "calibrate": calibrate, "device": str(dev)}
    # a prediction reads the shapes of one sample batch, not the data: no data fingerprint
    with tracked_run("predict", task_obj, config=run_config, device=dev, store=st, fingerprint=False) as run:
        result = dataclasses.replace(_predict(task_obj, merged, prec, spec, batch_size, max_batch=max_batch,
                                              foreach=foreach, calibrate=calibrate, dev=dev), run_id=run.id)
        metrics = {"predicted_peak_bytes": float(result.memory.peak_bytes), "params": float(result.params.total)}
        if result.step.time_ms is not None:
            metrics["predicted_step_time_ms"] = float(result.step.time_ms)
        if result.max_batch_size is not None:
            metrics["max_batch_size"] = float(result.max_batch_size)
        run.set(metrics=metrics, result=result.to_dict())
    return result


def _predict(task_obj: Task, merged: dict[str, Any], prec: str, spec: DeviceSpec, batch_size: int, *,
             max_batch: bool, foreach: bool | None, calibrate: int | None, dev: torch.device) -> PredictResult:
    """One prediction of validated inputs (see :func:`predict`)."""
    started = time.perf_counter()
    if foreach is None:
        foreach = spec.name not in ("cpu", "custom")
    tracer = _tracer(task_obj, merged, prec, foreach)
    traces: dict[int, _Trace] = {}

    def peak_at(b: int) -> int:
        if b not in traces:
            traces[b] = tracer.cache.get(b) or tracer.trace(b)
            tracer.cache[b] = traces[b]
        return traces[b].peak

    peak_at(batch_size)
    trace = traces[batch_size]
    parts = _assemble(trace, spec, tracer)
    static = parts["memory"].static_bytes
    memory = spec.memory_bytes
    fits = None if memory is None else trace.peak <= memory
    found: dict[str, Any] | None = None
    max_b: int | None = None
    if memory is not None and max_batch:
        if static >= memory:
            max_b = 0
        else:
            found = _largest_batch(lambda b: (peak_at(b), traces[b].phase_peaks), memory, batch_size)
            max_b = int(found["max_batch_size"])
    calibration = None
    if calibrate is not None:
        on_gpu = dev.type == "cuda"
        same = tracer if tracer.foreach == on_gpu else StepTracer(task_obj, merged, precision=prec, foreach=on_gpu)
        calibration = _calibrate(task_obj, merged, same, calibrate, dev)
    return PredictResult(
        task=task_obj.name or type(task_obj).__name__, device=spec.name, batch_size=batch_size, precision=prec,
        optimizer=str(merged.get("optimizer", "adamw")), target=spec.to_dict(), **parts,
        device_memory_bytes=memory, fits=fits, max_batch_size=max_b, max_batch=found,
        trace_s=time.perf_counter() - started, traces=len(traces) + (1 if calibration else 0),
        real_steps=int(calibration["real_steps"]) if calibration else 0, calibration=calibration,
        config={"params": {**merged, "batch_size": batch_size}},
    )


def _largest_batch(trace_at: Callable[[int], tuple[int, dict[str, int]]], budget: int, start: int,
                   *, max_verify: int = 3) -> dict[str, Any]:
    """The largest batch whose predicted peak plus batch-size's margin fits ``budget``.

    The peak of a step is the highest of its phases' peaks, each linear in the batch (the
    optimizer's does not grow with it): one memory model per phase (:func:`fit_memory_model`,
    margin from its residual, at least 0.5% of the budget) from fake steps at two batch sizes,
    the answer the smallest of the phases' answers, verified by a fake step there; a step over
    the budget joins the fits, and after ``max_verify`` the answer is bisected on fake steps.
    """
    probes: list[dict[str, Any]] = []
    points: dict[str, list[tuple[int, int]]] = defaultdict(list)
    fits: list[int] = []
    fails: list[int] = []

    def run(b: int, role: str) -> int:
        peak, phases = trace_at(b)
        for phase, value in phases.items():
            points[phase].append((b, value))
        ok = peak <= budget
        (fits if ok else fails).append(b)
        probes.append({"batch_size": b, "peak_bytes": peak, "status": "fits" if ok else "over_budget",
                       "role": role})
        return peak

    def answer() -> tuple[int, str, MemoryModel | None]:
        best, binding, model = 1 << 40, "", None
        for phase, pts in points.items():
            if len({b for b, _ in pts}) < 2:
                continue
            m = fit_memory_model(pts, budget)
            b = (1 << 40) if m.per_sample_bytes <= 0 and m.predict(0) + m.margin_bytes <= budget \
                else m.largest_batch(budget)
            if b < best:
                best, binding, model = b, phase, m
        return best, binding, model

    run(start, "probe")
    run(2 * start, "probe")
    b, binding, model = answer()
    for _ in range(max_verify):
        b = max(0, min(b, (min(fails) - 1) if fails else b, 1 << 31))
        if b < 1 or b in fits or b in fails:
            break
        run(b, "verify")
        b, binding, model = answer()
    low = max([x for x in fits if not any(f <= x for f in fails)], default=0)
    high = min(fails, default=None)
    margin = model.margin_bytes if model is not None else MIN_MARGIN_FRACTION * budget
    if high is not None:
        while high - low > 1:  # bisect on fake steps
            mid = (low + high) // 2
            if run(mid, "bisect") + margin <= budget:
                low = mid
            else:
                high = mid
    else:
        low = max(low, b if b < (1 << 40) else low)
    return {"max_batch_size": low, "binding_phase": binding, "probes": probes,
            "model": None if model is None else model.to_dict(),
            "note": "fake steps only; each phase's peak has its own memory model (batch-size's fit and margin)"}


_LAST: list[tuple[Any, StepTracer]] = []


def _tracer(task: Task, params: dict[str, Any], precision: str, foreach: bool) -> StepTracer:
    """The tracer of the same task object and settings as the last call (a 7B model takes tens
    of seconds to build and trace: asking again for another device reuses its traces)."""
    key = (id(task), repr(sorted(params.items())), precision, foreach)
    if _LAST and _LAST[0][0] == key and _LAST[0][1].task is task:
        return _LAST[0][1]
    tracer = StepTracer(task, params, precision=precision, foreach=foreach)
    _LAST[:] = [(key, tracer)]
    return tracer


def _calibrate(task: Task, params: dict[str, Any], tracer: StepTracer, batch_size: int,
               dev: torch.device) -> dict[str, Any]:
    """Predicted vs ``profile``'s measurement on ``dev`` (this machine) at ``batch_size``."""
    from ..profile import profile as run_profile

    here = resolve_target(_local_target(dev))
    if dev.type == "cuda" and here.name == "cpu":
        raise ConfigError(f"calibrate on {torch.cuda.get_device_name(dev)} needs its numbers, which the "
                          f"device table lacks; valid: device='cpu', or a GPU among {', '.join(_GPU_KEYS)}.")
    trace = tracer.trace(batch_size)
    _, phase_ms, _ = _roofline(trace, here)
    predicted_ms = sum(v for v in phase_ms.values() if v is not None)
    steps, warmup = 3, 1
    prof = run_profile(task, params=params, batch_size=batch_size, steps=steps, warmup=warmup, device=dev,
                       detail="step")
    measured_ms = float(prof.step.time_ms - prof.step.data_ms)
    measured_peak = int(prof.memory.peak_bytes)
    return {
        "batch_size": batch_size, "device": here.name,
        "predicted_peak_bytes": trace.peak, "measured_peak_bytes": measured_peak,
        "peak_error": trace.peak / measured_peak - 1 if measured_peak else None,
        "predicted_step_ms": predicted_ms, "measured_step_ms": measured_ms,
        "time_error": predicted_ms / measured_ms - 1 if measured_ms > 0 else None,
        "real_steps": steps + warmup,
    }


_GPU_KEYS = ("h200", "h100", "a100", "v100", "l4", "t4")


def _local_target(dev: torch.device) -> str:
    """``auto``: ``dev``'s entry in the device table when it is a CUDA device there, else this CPU."""
    if dev.type == "cuda" and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(dev).lower()
        for key in _GPU_KEYS:
            if key in gpu:
                return key
    return "cpu"


def summary_line(r: PredictResult) -> str:
    """One line: the peak, where, and whether it fits."""
    fit = "" if r.fits is None else (" fits" if r.fits else " does NOT fit")
    return (f"batch {r.batch_size}: predicted peak {format_bytes(r.memory.peak_bytes)} in {r.peak.phase}"
            f" ({r.peak.layer or 'outside layers'}, {r.peak.op});{fit} {format_bytes(r.device_memory_bytes)}")
