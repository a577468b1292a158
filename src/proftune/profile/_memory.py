"""Memory of a training step: parameters, gradients, optimizer state, saved activations, peak.

- Parameters, gradients, optimizer state: bytes of the tensors that hold them (optimizer
  state is read from the optimizer after a real step; scalar step counters are left out).
- Activations: every tensor autograd saves for backward passes through a saved-tensor hook
  (``torch.autograd.graph.saved_tensors_hooks``) and is attributed to the layer running when it
  was saved; a storage counts once, parameters saved by an op are not activations.
- Peak of one step: on CUDA the caching allocator's peak (``max_memory_allocated`` after
  ``reset_peak_memory_stats``). On CPU the allocation events of ``torch.profiler``
  (``profile_memory=True``) give every allocation and free during the step; their running sum
  on top of what was live when the step began (parameters, buffers, gradients, optimizer state,
  the batch) peaks at the step's peak.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from .._cpplog import filtered_cpp_logs
from ..train import Callback, FitState
from ._layers import LayerHooks

__all__ = [
    "ActivationRecorder",
    "PeakMemory",
    "collect_young",
    "grads_bytes",
    "live_bytes",
    "optimizer_state_bytes",
    "params_bytes",
    "peak_step_memory",
    "tensor_bytes",
]


def tensor_bytes(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


def _unique_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors, each storage once (a view shares its base's memory)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        try:
            key = (str(t.device), t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):
            total += tensor_bytes(t)
            continue
        if key in seen and key[1] != 0:
            continue
        seen.add(key)
        total += tensor_bytes(t)
    return total


def params_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters (a shared parameter counts once)."""
    return _unique_bytes(model.parameters())


def buffers_bytes(model: nn.Module) -> int:
    """Bytes of the model's buffers (BatchNorm running statistics, ...)."""
    return _unique_bytes(model.buffers())


def grads_bytes(model: nn.Module) -> int:
    """Bytes of the gradients the parameters hold now."""
    return _unique_bytes(p.grad for p in model.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of the optimizer's state tensors (Adam: ``exp_avg``, ``exp_avg_sq``); the 0-d step
    counters are bookkeeping, not state that scales with the model, and are left out."""
    if optimizer is None:
        return 0
    tensors: list[torch.Tensor] = []
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not (key == "step" and value.dim() == 0):
                tensors.append(value)
    return _unique_bytes(tensors)


def collect_young() -> None:
    """Collect the cycles among the objects made since the last collection (the previous step's
    graph, a trial's model): what a memory window must not see freed. A full collection walks
    every object the process holds (torch, scikit-learn, Optuna, SQLAlchemy): 0.4-0.6 s in an
    optimize run, where it ran once, in the health stage's profile, 5-7% of a budget of 8
    trainings (issue 60's generated tasks); the young generations take milliseconds."""
    gc.collect(1)


def live_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None, batch: Any = None) -> int:
    """What a step starts with: parameters, buffers, gradients held, optimizer state, the batch."""
    leaves, _ = tree_flatten(batch)
    batch_tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    return (params_bytes(model) + buffers_bytes(model) + grads_bytes(model)
            + optimizer_state_bytes(optimizer) + _unique_bytes(batch_tensors))


class ActivationRecorder:
    """Bytes autograd saves for backward, per layer, while attached (one forward pass).

    The saved-tensor hooks are a thread-local stack: attach before the forward pass and detach
    after it, on the same thread.
    """

    def __init__(self, model: nn.Module, *, hooks: LayerHooks | None = None) -> None:
        self.model = model
        self._hooks = hooks if hooks is not None else LayerHooks(model)
        self._ctx: Any = None
        self._seen: set[tuple[torch.device, int]] = set()
        #: Bytes saved for backward, per layer path ("" for work outside any module).
        self.per_layer: dict[str, int] = {}
        self.total = 0

    @property
    def attached(self) -> bool:
        return self._ctx is not None

    def attach(self) -> ActivationRecorder:
        if self._ctx is not None:
            return self
        self.per_layer, self.total = {}, 0
        self._seen = set()
        self._hooks.attach()
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._ctx.__enter__()
        return self

    def detach(self) -> None:
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            ctx.__exit__(None, None, None)
        self._hooks.detach()
        self._seen = set()

    def __enter__(self) -> ActivationRecorder:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        # a parameter, or a view of one (``linear`` saves ``weight.t()``), is not an activation;
        # asking the tensor is cheaper than a set of the parameters' storages, rebuilt on every
        # attach by walking a deep model's modules
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter):
            return t
        try:
            storage = t.untyped_storage()
            key = (t.device, storage.data_ptr())
            nbytes = int(storage.nbytes())
        except (RuntimeError, NotImplementedError):
            return t
        if key in self._seen or nbytes == 0:
            return t
        self._seen.add(key)
        layer = self._hooks.current or ""
        self.per_layer[layer] = self.per_layer.get(layer, 0) + nbytes
        self.total += nbytes
        return t


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def _walk(nodes: Iterable[Any]) -> Iterable[Any]:
    stack = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


class PeakMemory:
    """The peak of torch's allocations on ``device`` between :meth:`start` and :meth:`stop`.

    ``start(baseline)`` takes the bytes live at the start (CPU only: the profiler sees the
    allocations made while it runs, not those made before).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._prof: Any = None
        self._quiet = contextlib.ExitStack()  # the C++ log filter, open while the profiler is
        self._baseline = 0
        self.peak: int | None = None

    def start(self, baseline: int = 0) -> PeakMemory:
        self.peak = None
        self._baseline = int(baseline)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            from torch.profiler import ProfilerActivity, profile

            # its memory profiling logs a C++ line per 1,000 frees of tensors made before the window
            self._quiet = contextlib.ExitStack()
            self._quiet.enter_context(filtered_cpp_logs())
            try:
                self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
                self._prof.__enter__()
            except BaseException:
                self._quiet.close()
                raise
        return self

    def stop(self) -> int:
        """End the window; the peak in bytes."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
            return self.peak
        prof, self._prof = self._prof, None
        if prof is None:
            raise RuntimeError("PeakMemory.stop() was called without start().")
        with self._quiet:
            prof.__exit__(None, None, None)
        self.peak = self._baseline + _peak_of_allocations(prof)
        return self.peak

    def abort(self) -> None:
        """Stop without a result (after an error)."""
        if self._prof is not None:
            prof, self._prof = self._prof, None
            with self._quiet, contextlib.suppress(Exception):
                prof.__exit__(None, None, None)


def _peak_of_allocations(prof: Any) -> int:
    """Highest running sum of the CPU allocations (+) and frees (-) the profiler recorded."""
    from torch._C._profiler import _EventType

    tree = prof.profiler.kineto_results.experimental_event_tree()
    events = []
    for node in _walk(tree):
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            if fields.device.type == "cpu":
                events.append((node.start_time_ns, int(fields.alloc_size)))
    events.sort()
    run = peak = 0
    for _, size in events:
        run += size
        peak = max(peak, run)
    return peak


class _PeakCallback(Callback):
    """A fit-loop callback: measures the peak of the first full-size step from step ``at`` on.

    A partial last batch of an epoch (dataset size not a multiple of the batch size) is skipped:
    its peak is not the peak at the requested batch size.
    """

    def __init__(self, device: torch.device, at: int) -> None:
        self.tracker = PeakMemory(device)
        self.at = at
        self.peak: int | None = None
        self.full: int | None = None
        self.measuring = False

    def on_step_start(self, state: FitState) -> None:
        from .._device import batch_size_of

        size = batch_size_of(state.batch)
        if self.full is None:
            self.full = size  # the first batch of an epoch is full-size
        if state.step + 1 < self.at or size < self.full:
            return
        # the loop frees the old gradients first thing in the step: free them before the window
        # opens, so that their release (invisible to the profiler) does not go uncounted
        if state.optimizer is not None:
            state.optimizer.zero_grad(set_to_none=True)
        collect_young()
        self.tracker.start(live_bytes(state.model, state.optimizer, state.batch))
        self.measuring = True

    def on_step_end(self, state: FitState) -> None:
        if self.measuring:
            self.measuring = False
            self.peak = self.tracker.stop()
            state.request_stop("peak memory measured")

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        self.tracker.abort()


def peak_step_memory(task: Any, params: dict[str, Any] | None = None, *, batch_size: int,
                     device: str | torch.device = "auto", seed: int = 0) -> int:
    """Peak bytes of ONE training step of ``task`` at ``batch_size`` (the definition of
    ``Profile.memory.peak_bytes``): one warm-up step creates the optimizer state, the second
    step is measured. Runs through the fit loop.

    A CUDA out-of-memory error propagates as ``torch.OutOfMemoryError`` with the memory freed,
    so a caller (the batch-size finder) can take it as the answer "does not fit".
    """
    from .._device import resolve_device
    from ..exceptions import ConfigError
    from ..train import fit

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, but got {batch_size=}.")
    dev = resolve_device(device)
    cb = _PeakCallback(dev, at=2)
    message: str | None = None
    try:
        # step 2 is measured, or step 3 when step 2 is an epoch's partial last batch
        fit(task, params, max_steps=3, batch_size=batch_size, device=dev, seed=seed,
            callbacks=[cb], evaluate=False)
    except torch.OutOfMemoryError as exc:
        message = str(exc)
    if message is not None:
        # leave the except block first: the traceback holds the step's tensors
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        raise torch.OutOfMemoryError(f"batch_size={batch_size} does not fit on {dev}: {message}")
    if cb.peak is None:
        raise RuntimeError(
            f"peak_step_memory: the task's training data gave fewer than 2 batches at {batch_size=}."
        )
    return cb.peak
