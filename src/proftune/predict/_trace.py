"""Predict the memory and time of one training step without running it: fake tensors.

The task's model is built on the meta device and its parameters, buffers and a batch of the
asked size become fake tensors (``torch._subclasses.fake_tensor.FakeTensorMode``): every op of
one training step runs its shape rules only, nothing is allocated, so a 7B-parameter model is
traced on a laptop. The step is the fit loop's own (:func:`proftune.train.run_step` with the
task's :class:`~proftune.train.StepSpec`: accumulation, autocast, GradScaler, clipping), not a
copy of it.

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

from .._device import batch_size_of
from ..exceptions import ConfigError
from ..profile import LayerHooks, UncountedOpEntry, UncountedOps, op_flops, uncounted_op
from ..task import Task
from ..train import StepPhases, StepSpec, run_step
from ._checkpointing import apply_activation_checkpointing, block_units

__all__ = ["PHASES", "StepTracer"]

log = logging.getLogger(__name__)

#: Batch size of the real sample batch whose structure the fake batch copies.
_SAMPLE_BATCH = 3
PHASES = ("forward", "backward", "optimizer")
_LOW = {torch.bfloat16: "bf16", torch.float16: "fp16"}


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
    #: The micro-batch whose forward or backward ran it (the optimizer's ops: the last one's).
    micro: int = 0


@dataclass
class MemoryTrace:
    peak: int = 0
    #: The highest live bytes within each phase.
    phase_peaks: dict[str, int] = field(default_factory=dict)
    #: The live bytes by kind at each phase's peak (they add up to ``phase_peaks[phase]``).
    phase_breakdowns: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Backward's moments by the gradient bytes live then: for each amount of gradients made so
    #: far, the live bytes by kind at the highest total with that amount. A strategy that shards
    #: gradients as backward makes them peaks earlier than the single device: it prices each.
    grad_moments: dict[int, dict[str, int]] = field(default_factory=dict)
    peak_where: tuple[str, str, str] = ("", "", "")
    peak_breakdown: dict[str, int] = field(default_factory=dict)
    ops: list[_OpRecord] = field(default_factory=list)
    activations: dict[str, int] = field(default_factory=dict)
    uncounted: list[UncountedOpEntry] = field(default_factory=list)
    layer_types: dict[str, str] = field(default_factory=dict)
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    #: Bytes of the parameters, the buffers and the batch (each storage once).
    params_bytes: int = 0
    buffers_bytes: int = 0
    batch_bytes: int = 0
    #: Micro-batches of the step (grad_accumulation); at most two are traced.
    micro_batches: int = 1

    @property
    def static_bytes(self) -> int:
        """What no batch size changes: parameters, buffers, gradients, optimizer state."""
        return self.params_bytes + self.buffers_bytes + self.grads_bytes + self.optimizer_bytes

    def weight(self, op: _OpRecord) -> int:
        """How many of the step's micro-batches ``op`` stands for: the first micro-batch's ops
        once, the second's (the steady state) for every later one, the optimizer's once."""
        if op.phase not in ("forward", "backward") or op.micro == 0:
            return 1
        return self.micro_batches - 1


class _StepTracker(TorchDispatchMode):
    """Live bytes by kind, the running peak and where it happens; per op FLOPs and bytes."""

    def __init__(self, layer_of: Callable[[], str]) -> None:
        super().__init__()
        self.layer_of = layer_of
        self.phase = "setup"
        self.micro = 0
        self.live: dict[str, int] = defaultdict(int)
        self.total = 0
        self.info: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.trace = MemoryTrace()
        self.uncounted = UncountedOps()
        self._moment_totals: dict[int, int] = {}

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
            self.trace.phase_breakdowns[self.phase] = {k: v for k, v in self.live.items() if v}
        if self.phase == "backward":
            grads = self.live.get("grads", 0)
            if self.total > self._moment_totals.get(grads, -1):
                self._moment_totals[grads] = self.total
                self.trace.grad_moments[grads] = {k: v for k, v in self.live.items() if v}
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
        self.trace.ops.append(_OpRecord(self.layer_of(), self.phase, flops, nbytes, compute, self.micro))
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


class _TracedScaler(torch.amp.GradScaler):
    """The fp16 step's GradScaler on fake tensors: it scales the loss and unscales the gradients
    like the real one (the same ops, the same memory), then takes the optimizer step that a step
    without overflow takes; whether a gradient overflowed has no value on a fake tensor."""

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)


class _TracePhases(StepPhases):
    """The predictor's side of :func:`run_step`: every op is tagged with its phase and micro-batch;
    in forward, the layer that ran it is written on its autograd node (for backward) and what
    autograd saves is counted as the layer's activations (the first micro-batch's)."""

    def __init__(self, tracker: _StepTracker, layers: _LayerStack,
                 pack: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.tracker, self.layers, self.pack = tracker, layers, pack
        self.micro = -1

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        self.micro += 1
        self.tracker.phase, self.tracker.micro = "forward", self.micro
        with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t), _TagNodes(self.layers):
            yield

    @contextlib.contextmanager
    def backward(self) -> Iterator[None]:
        self.tracker.phase = "backward"
        self.layers.backward = True
        try:
            yield
        finally:
            self.layers.backward = False

    @contextlib.contextmanager
    def optimizer(self) -> Iterator[None]:
        self.tracker.phase = "optimizer"
        yield


class StepTracer:
    """Traces training steps of one task under fake tensors; the model is built once (on the
    meta device, then faked) and every :meth:`trace` runs one step at a batch size through the
    fit loop's own :func:`~proftune.train.run_step` (zero_grad(set_to_none), each micro-batch's
    forward and loss under autocast, scaled backward, unscale, clip, optimizer step), the
    optimizer's state created first by a step on zero gradients (as after warm-up).

    ``batch_size`` is the micro-batch's, as the fit loop's ``batch_size`` is. With
    ``grad_accumulation`` k > 1 two micro-batches are traced: the second runs as every later one
    does (the gradients of the earlier ones live), so the peak is the step's, and the step's time
    is the first micro-batch's plus k - 1 times the second's.

    ``foreach`` uses the multi-tensor optimizer kernels (PyTorch's default on CUDA).
    """

    def __init__(self, task: Task, params: dict[str, Any], *, precision: str = "fp32",
                 foreach: bool = False, checkpointing: str = "none") -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        if params.get("optimizer") == "lbfgs":
            raise ConfigError("predict does not support optimizer='lbfgs' (its step re-runs the model "
                              "a data-dependent number of times); valid: adamw, adam, sgd.")
        self.task, self.params, self.precision, self.foreach = task, params, precision, foreach
        self.spec = dataclasses.replace(StepSpec.from_params(params), precision=precision)
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
        #: The blocks that FSDP wraps and activation checkpointing recomputes (module paths).
        self.units = [name for name, _ in block_units(model)]
        self.checkpointing = apply_activation_checkpointing(model, checkpointing)
        self.model = model
        self.traces = 0
        #: Traces by batch size (a trace depends on nothing else).
        self.cache: dict[int, MemoryTrace] = {}

    @property
    def grad_accumulation(self) -> int:
        return self.spec.grad_accumulation

    def trace(self, batch_size: int) -> MemoryTrace:
        model, params, spec = self.model, self.params, self.spec
        layers = _LayerStack(model)
        tracker = _StepTracker(layers.current)
        tracker.trace.layer_types = self.layer_types
        tracker.trace.micro_batches = spec.grad_accumulation
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
            static = (_unique_bytes(model.parameters()), _unique_bytes(model.buffers()),
                      _unique_bytes(tree_flatten(batch)[0]))
            saved = WeakIdKeyDictionary()

            def pack(t: torch.Tensor) -> torch.Tensor:
                st = t.untyped_storage()
                if st in param_storages or st in saved:
                    return t
                saved[st] = True
                if tracker.micro == 0:
                    activations[tracker.layer_of()] += int(st.nbytes())
                return t

            def on_grad(p: torch.Tensor) -> None:
                if p.grad is not None:
                    tracker.track(p.grad.untyped_storage(), "grads")

            hooks = [p.register_post_accumulate_grad_hook(on_grad) for p in trainable]
            scaler = _TracedScaler("cpu") if spec.precision == "fp16" else None
            try:
                with layers, tracker:
                    run_step(self.task, model, optimizer, [batch] * min(spec.grad_accumulation, 2), spec,
                             device_type="cpu", scaler=scaler, phases=_TracePhases(tracker, layers, pack))
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
            del optimizer, batch, scaler
        trace.activations = dict(activations)
        trace.uncounted = tracker.uncounted.to_list()
        trace.params_bytes, trace.buffers_bytes, trace.batch_bytes = static
        return trace


def _optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
