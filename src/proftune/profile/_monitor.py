"""The Monitor: the fit loop's callbacks and the profiler's sampling inside a user's own loop.

```python
with proftune.Monitor(model, optimizer, every=50) as mon:
    for x, y in data:
        loss = F.cross_entropy(model(x), y)
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        mon.step(loss)
mon.profile    # a Profile built from the sampled steps
```

Only every N-th step (the N-th, 2N-th, ...) is instrumented: the per-layer hooks are attached
when the step before it ends and removed when it ends, so the other steps run the model
untouched. Sampled steps take turns: one measures per-layer time, saved activations and the
step's phases, the next the weight, activation and gradient statistics (so the cost of the
statistics never lands in a timing). Their wall time (between ``mon.step`` calls)
is the clean step time the profile reports. Callbacks get the same hooks as in
:func:`proftune.train.fit`: ``on_fit_start`` at ``__enter__``, ``on_step_start`` from a
forward pre-hook on the model (first forward of a step), ``on_after_backward`` from an
optimizer step pre-hook, ``on_step_end`` at ``mon.step(loss)``, ``on_fit_end`` at ``__exit__``;
the :class:`FitState` has ``task=None``.

A sampled step costs about two plain steps at any depth (``benchmarks/profiler_overhead.py``):
the layer hooks are two global module hooks, not a pair per module; statistics are a few
tensor ops per layer with one host copy per step, and their reduction (sorts, percentiles)
waits until the profile is read (see :mod:`._stats`); a model's parameters come from the
optimizer, not a walk of its modules; the cyclic garbage collector waits for the sample's end
(the sample's objects are gone by then, so they never bring on a full collection, ~0.4 s with
torch loaded). On a model of more than :data:`STATS_MIN_LAYERS` layers each statistics sample
takes a ``1/stats_rotation`` share of the layers, round-robin, so that every layer is covered
once every ``stats_rotation`` statistics samples (the profile keeps each layer's latest). The
global gradient norm is measured on every sample; the global update ratio of a rotated model
combines each layer's latest measured update and weight norms.

With ``max_overhead`` (``proftune run`` sets 0.015 unless ``--every`` is given) the interval is
computed from what sampling costs: after each sample its wall time (the step and the sample's
bookkeeping after it) beside the median unsampled step gives its excess, and the next sample
comes ``max(every, excess / (max_overhead x step))`` steps later (at most ``MAX_SPREAD x every``):
a small step (a 2 ms MLP step, whose sample costs about 3 steps) is sampled less often than
``every`` so that sampling stays within ``max_overhead`` of the training's time.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .._device import batch_size_of, clock
from .._tensors import l2_norm
from ..exceptions import ConfigError
from ..train import Callback, FitState
from ._assemble import Measurements, StatsMerge, assemble_profile, static_counts
from ._comm import CommRecorder, is_ddp, unwrap
from ._layers import LayerHooks
from ._memory import (
    ActivationRecorder,
    PeakMemory,
    grads_bytes,
    live_bytes,
    optimizer_state_bytes,
    params_bytes,
)
from ._records import Profile
from ._stats import LayerStats
from ._timing import LayerTimer, median, scaled_to, step_summary

__all__ = ["Monitor"]

#: The fewest layers a statistics sample covers: a model with no more gets all of them each time.
STATS_MIN_LAYERS = 8
#: With ``max_overhead``, samples are at most this many times ``every`` apart.
MAX_SPREAD = 10


def _combined_ratio(parts: Iterable[tuple[float, float]]) -> float | None:
    """``||update|| / ||weights||`` over layers given as ``(||update||, ||weights||)`` pairs."""
    u2 = w2 = 0.0
    for u, w in parts:
        if math.isfinite(u) and math.isfinite(w):
            u2 += u * u
            w2 += w * w
    return math.sqrt(u2) / math.sqrt(w2) if w2 > 0 else None


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    for b in model.buffers():
        return b.device
    return torch.device("cpu")


class Monitor:
    """Sample every ``every``-th step of a user's training loop; see the module docstring.

    ``stats``: weight/activation/gradient statistics per layer; ``timing``: per-layer forward
    and backward time; ``activations``: bytes saved for backward per layer. ``peak_memory``:
    the peak of the sampled steps (default: on CUDA, where the allocator counts it for free,
    though it resets the allocator's peak counter, ``torch.cuda.reset_peak_memory_stats``, at
    each timed sample; on CPU it needs ``torch.profiler``'s memory events and is off unless
    asked for).
    ``stats_rotation``: on a model of more than :data:`STATS_MIN_LAYERS` layers, a statistics
    sample covers ``ceil(layers / stats_rotation)`` of them (at least that minimum), the next
    ones on the next sample, so each layer is covered once every ``stats_rotation`` statistics
    samples (1: every layer on every sample, at a cost that grows with depth).
    ``callbacks`` are :class:`proftune.train.Callback` objects.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        every: int = 50,
        callbacks: Sequence[Callback] = (),
        stats: bool = True,
        timing: bool = True,
        activations: bool = True,
        peak_memory: bool | None = None,
        stats_rotation: int = 4,
        task: str | None = None,
        max_overhead: float | None = None,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"every must be a positive integer (sample every N-th step), but got {every=}.")
        if isinstance(stats_rotation, bool) or not isinstance(stats_rotation, int) or stats_rotation < 1:
            raise ConfigError("stats_rotation must be a positive integer (every layer's statistics once every "
                              f"N statistics samples; 1: all layers each time), but got {stats_rotation=}.")
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model must be a torch.nn.Module, but got {type(model).__name__}.")
        if max_overhead is not None and (isinstance(max_overhead, bool) or not 0 < max_overhead < 1):
            raise ConfigError(f"max_overhead must be a share of the training's time in (0, 1) or None, "
                              f"but got {max_overhead=}.")
        self.max_overhead = max_overhead
        #: The step index of the next sampled step (``every - 1``, then spaced by :meth:`_space`).
        self._next_at = every - 1
        #: The steps between samples as computed (``every`` without ``max_overhead``).
        self.gaps: list[int] = []
        self.model = model
        self.inner = unwrap(model)
        self.optimizer = optimizer
        self.every = every
        self.stats_rotation = stats_rotation
        self.callbacks = list(callbacks)
        self.task = task
        self.device = _device_of(self.inner)
        self.peak_memory = (self.device.type == "cuda") if peak_memory is None else bool(peak_memory)
        self.state = FitState(task=None, model=model, optimizer=optimizer, params={}, device=self.device)
        # one set of forward hooks serves the timer, the statistics and the activation recorder
        self._cuda = self.device.type == "cuda"
        self._hooks = LayerHooks(self.inner, sync=self._cuda, device=self.device)
        self._timer = LayerTimer(self.inner, self.device, hooks=self._hooks) if timing else None
        self._stats = LayerStats(self.inner, hooks=self._hooks) if stats else None
        self._acts = ActivationRecorder(self.inner, hooks=self._hooks) if activations else None
        self._peak = PeakMemory(self.device) if self.peak_memory else None
        self._comm: CommRecorder | None = None
        self._always: list[Any] = []  # hooks that drive callbacks: present only with callbacks
        self._sample_hooks: list[Any] = []
        #: The kind of the sampled step running now ("time" or "stats"), None between samples.
        self._sampling: str | None = None
        # the sampled steps take turns: per-layer time, saved activations and the step's phases
        # on one, statistics on the next, so computing statistics never shows up in a timing
        # (and a sampled step costs about half as much)
        self._kinds = (["time"] if (timing or activations or self.peak_memory or not stats) else []) + (
            ["stats"] if stats else [])
        self._started = False
        self._in_step = False
        self._last = 0.0
        self._mark: dict[str, float] = {}
        self._example: Any = None
        self._batch = 0
        self._m = Measurements()
        self._merged = self._m.merged_stats = StatsMerge()
        self._sample_timings: list[dict[str, float]] = []
        self._clean_walls: list[float] = []
        self._peaks: list[int] = []
        self._acts_totals: list[int] = []
        self._samples = 0
        self._profile: Profile | None = None
        self._paused_at: float | None = None
        self._gc_paused = False  # the collector was on and is off for the sampled step
        self._cursor = 0  # where the next statistics sample's share of the layers starts
        self._update_parts: dict[str, tuple[float, float]] = {}  # layer -> latest (||update||, ||w||)
        self._step_grad_norm: float | None = None
        self._grads_key: tuple[int, int] | None = None  # (gradients held, their elements) last measured

    # -- context ----------------------------------------------------------------------------
    def __enter__(self) -> Monitor:
        if is_ddp(self.model) and self._comm is None:
            self._comm = CommRecorder(self.model)
            self._comm.recording = False
        if self.callbacks:
            self._always.append(self.model.register_forward_pre_hook(self._callback_step_start))
            if self.optimizer is not None:
                self._always.append(self.optimizer.register_step_pre_hook(self._callback_after_backward))
        for cb in self.callbacks:
            cb.on_fit_start(self.state)
        self._started = True
        self._last = self._now(sync=True)
        if self._is_sampled(self.state.step):
            self._attach_sample()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._detach_sample(abort=True)
        for h in self._always:
            h.remove()
        self._always.clear()
        self._started = False
        if exc is not None:
            for cb in self.callbacks:
                try:
                    cb.on_exception(self.state, exc)
                except Exception:  # noqa: BLE001 - a failing callback must not hide the user's error
                    pass
            return
        for cb in self.callbacks:
            cb.on_fit_end(self.state)

    def _is_sampled(self, step: int) -> bool:
        if self.max_overhead is None:
            return (step + 1) % self.every == 0
        return step >= self._next_at

    def _space(self, sampled_step: int, wall_ms: float) -> None:
        """The next sample's step, from this one's cost (``max_overhead``; see the module docstring)."""
        gap = self.every
        recent = self._clean_walls[-64:]
        if self.max_overhead is not None and recent:
            clean = median(recent)
            if clean > 0:
                excess = max(0.0, wall_ms - clean)
                gap = min(MAX_SPREAD * self.every, max(self.every, math.ceil(excess / (self.max_overhead * clean))))
        self.gaps.append(gap)
        self._next_at = sampled_step + gap

    @property
    def sampling(self) -> bool:
        """True while the current step is instrumented."""
        return self._sampling is not None

    def _now(self, *, sync: bool = False) -> float:
        return clock(self.device if sync else None)

    # -- hooks that drive callbacks (only when there are callbacks) ---------------------------
    def _callback_step_start(self, mod: nn.Module, args: tuple[Any, ...]) -> None:
        if self._in_step or self._paused_at is not None:
            return
        self._in_step = True
        self.state.batch = args[0] if len(args) == 1 else args
        for cb in self.callbacks:
            cb.on_step_start(self.state)

    def _callback_after_backward(self, opt: Any, args: Any, kwargs: Any) -> None:
        for cb in self.callbacks:
            cb.on_after_backward(self.state)

    # -- sampled steps --------------------------------------------------------------------------
    @property
    def _timed(self) -> bool:
        """Whether this sample's clocks synchronise the device (only a timed sample reads them:
        a statistics sample on a GPU syncs neither per module nor per phase)."""
        return self._sampling == "time" and self._cuda

    def _attach_sample(self) -> None:
        kind = self._kinds[self._samples % len(self._kinds)]
        self._sampling = kind
        self._hooks.sync = self._timed
        # the cyclic garbage collector waits for the sample's end: the objects a sample makes
        # live until it ends and then go, and collections in between would promote them, which
        # brings on a full collection (~0.4 s with torch loaded) every few hundred samples
        self._gc_paused = gc.isenabled()
        if self._gc_paused:
            gc.disable()
        self._mark = {"start": self._last, "forward_ms": 0.0}
        self._sample_hooks.append(self.model.register_forward_pre_hook(self._sample_fwd_start, with_kwargs=True))
        self._sample_hooks.append(self.model.register_forward_hook(self._sample_fwd_end))
        if self.optimizer is not None:
            self._sample_hooks.append(self.optimizer.register_step_pre_hook(self._sample_opt_start))
            self._sample_hooks.append(self.optimizer.register_step_post_hook(self._sample_opt_end))
        if kind == "stats":
            assert self._stats is not None
            self._stats.only = self._stats_share()
            self._stats.attach(self.optimizer)
            return
        if self._timer is not None:
            self._timer.attach()
        if self._acts is not None:
            self._acts.attach()
        if self._comm is not None:
            self._comm.discard_step()
            self._comm.recording = True
        if self._peak is not None:
            self._peak.start(live_bytes(self.inner, self.optimizer))

    def _stats_share(self) -> set[str] | None:
        """The layers the next statistics sample covers (None: all): the next
        ``ceil(layers / stats_rotation)`` of them, in the order they run, wrapping around."""
        assert self._stats is not None
        names = self._stats.names()
        n = len(names)
        share = max(STATS_MIN_LAYERS, math.ceil(n / self.stats_rotation))
        if share >= n:
            return None
        start = self._cursor % n
        self._cursor = start + share
        return set(names[start:start + share] + names[:max(start + share - n, 0)])

    def _detach_sample(self, *, abort: bool = False) -> None:
        for h in self._sample_hooks:
            h.remove()
        self._sample_hooks.clear()
        for part in (self._timer, self._stats, self._acts):
            if part is not None:
                part.detach()
        if self._comm is not None:
            self._comm.recording = False
        if abort and self._peak is not None and self._sampling == "time":
            self._peak.abort()
        self._sampling = None
        if abort:
            self._resume_gc()

    def _resume_gc(self) -> None:
        if self._gc_paused:
            self._gc_paused = False
            gc.enable()

    def _sample_fwd_start(self, mod: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        now = self._now(sync=self._timed)
        self._mark.setdefault("fwd_start", now)
        self._mark["_fwd_t0"] = now
        if self._example is None:
            from torch.utils._pytree import tree_map

            example = kwargs if (kwargs and not args) else (args[0] if len(args) == 1 else args)
            # detached: an input computed by another model (a GAN's generator) carries its graph
            self._example = tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, example)
        self._batch += batch_size_of(args if args else list(kwargs.values()))

    def _sample_fwd_end(self, mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        now = self._now(sync=self._timed)
        self._mark["forward_ms"] += (now - self._mark.get("_fwd_t0", now)) * 1e3
        self._mark["fwd_end"] = now

    def _sample_opt_start(self, opt: Any, args: Any, kwargs: Any) -> None:
        now = self._now(sync=self._timed)
        self._mark["bwd_end"] = now
        if self._sampling == "time" and self._timer is not None:
            self._timer.mark_backward_end(now)
        # the optimizer's own parameters: walking a deep model's modules costs as much as its step
        grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
        # (a statistics sample measures the global norm with the layers' norms)
        self._step_grad_norm = l2_norm(grads) if grads and self._sampling == "time" else None
        key = (len(grads), sum(g.numel() for g in grads))
        if key != self._grads_key:  # the bytes change only when the gradients held do
            self._grads_key = key
            self._m.grads_bytes = grads_bytes(self.inner)

    def _sample_opt_end(self, opt: Any, args: Any, kwargs: Any) -> None:
        self._mark["opt_end"] = self._now(sync=self._timed)

    def _finish_sample(self, kind: str, now: float) -> None:
        mk = self._mark
        g = self._step_grad_norm
        self._step_grad_norm = None
        if kind == "stats":
            stats = self._stats
            assert stats is not None
            # read now, reduced when the profile is read: a sampled step does not sort
            step = stats.gather(self.optimizer)
            self._merged.add_deferred(step.entries, step.kinds, step.kind)
            stats.release()
            g = stats.grad_norm()
            if stats.only is None:
                u = stats.update_ratio()
                self._update_parts.clear()
            else:
                self._update_parts.update(stats.update_norms())
                u = _combined_ratio(self._update_parts.values())
            if g is not None:
                self._m.grad_norms.append(g)
            if u is not None:
                self._m.update_ratios.append(u)
            self._samples += 1
            self._profile = None
            return
        if g is not None:
            self._m.grad_norms.append(g)
        if self._acts is not None:
            self._acts_totals.append(self._acts.total)
            self._m.activation_per_layer = dict(self._acts.per_layer)
        if self._peak is not None:
            self._peaks.append(self._peak.stop())
        fwd_start = mk.get("fwd_start", mk["start"])
        fwd_end = mk.get("fwd_end", fwd_start)
        bwd_end = mk.get("bwd_end", now)
        opt_end = mk.get("opt_end", bwd_end)
        timing = {
            "data_ms": (fwd_start - mk["start"]) * 1e3,
            "forward_ms": mk["forward_ms"],
            "backward_ms": max(bwd_end - fwd_end, 0.0) * 1e3,
            "optimizer_ms": max(opt_end - bwd_end, 0.0) * 1e3,
            "wall_ms": (now - mk["start"]) * 1e3,
        }
        self._sample_timings.append(timing)
        if self._timer is not None:
            if "bwd_end" not in mk:
                self._timer.mark_backward_end(now)
            self._timer.end_step(timing["forward_ms"] + timing["backward_ms"])
            self._timer.fold()
        if self._comm is not None:
            self._comm.end_step(step_ms=timing["wall_ms"])
        self._samples += 1
        self._profile = None

    # -- the user's call ------------------------------------------------------------------------
    def step(self, loss: torch.Tensor | float | None = None) -> None:
        """End a training step (after the optimizer step); ``loss`` is the step's loss."""
        if not self._started:
            raise RuntimeError("Monitor.step() was called outside `with Monitor(...) as mon:`.")
        kind = self._sampling
        sampled = kind is not None
        now = self._now(sync=sampled)
        if kind is not None:
            self._detach_sample()
            try:
                self._finish_sample(kind, now)
            finally:
                self._resume_gc()
            if self.max_overhead is not None:
                self._space(self.state.step, (self._now() - self._last) * 1e3)
        else:
            self._clean_walls.append((now - self._last) * 1e3)
        state = self.state
        state.step += 1
        if loss is not None and (sampled or self.callbacks):
            if isinstance(loss, torch.Tensor):
                # detached: holding the step's graph until the next sample keeps its nodes alive
                state.loss_tensor = loss.detach()
                state.loss = float(state.loss_tensor)
            else:
                state.loss = float(loss)
        if sampled and self._batch:
            state.batch_size = self._batch
            state.samples_seen += self._batch
        self._batch = 0
        self._in_step = False
        for cb in self.callbacks:
            cb.on_step_end(state)
        self._last = self._now(sync=sampled)
        if self._is_sampled(state.step):
            self._attach_sample()

    def pause(self) -> None:
        """Stop watching until :meth:`resume`: an evaluation between two steps (a trainer's
        validation) is neither a step nor part of one's time."""
        if self._paused_at is not None or not self._started:
            return
        self._paused_at = self._now(sync=True)
        if self._sampling is not None:
            self._detach_sample(abort=True)

    def resume(self) -> None:
        """Watch again after :meth:`pause`; the paused time is left out of the next step's time."""
        if self._paused_at is None:
            return
        self._last += self._now(sync=True) - self._paused_at
        self._paused_at = None
        if self._is_sampled(self.state.step):
            self._attach_sample()

    # -- results --------------------------------------------------------------------------------
    @property
    def samples(self) -> int:
        """Sampled steps so far."""
        return self._samples

    @property
    def findings(self) -> list[Any]:
        """Findings of the callbacks that keep a ``findings`` list (diagnose's checks do)."""
        out: list[Any] = []
        for cb in self.callbacks:
            found = getattr(cb, "findings", None)
            if found:
                out.extend(found)
        return out

    @property
    def profile(self) -> Profile:
        """A :class:`Profile` from the sampled steps (static counts on the first sampled input)."""
        if self._samples == 0:
            raise RuntimeError(
                f"no step was sampled yet: the Monitor samples every {self.every}-th step and "
                f"{self.state.step} step(s) ran; use a smaller `every`."
            )
        if self._profile is None:
            self._profile = self._build()
        return self._profile

    def _build(self) -> Profile:
        m = self._m
        if self._timer is not None:
            m.take_layers(self._timer)
        batch = self.state.batch_size
        summary = step_summary(self._sample_timings, [batch] * len(self._sample_timings))
        sampled_ms = None
        if self._clean_walls:
            # the reported step is the untouched one; the phases are measured on the sampled steps,
            # whose hooks make them slower: their shares of the sampled step are applied to it, so
            # that the phases add up to the step they are shown under
            wall = median(self._clean_walls)
            summary = scaled_to(summary, wall)
            sampled_ms = summary.pop("sampled_ms")
            summary["min_ms"] = min(self._clean_walls)
            summary["noise"] = wall / summary["min_ms"] - 1 if summary["min_ms"] > 0 else 0.0
            summary["throughput"] = batch / (wall / 1e3) if wall > 0 else 0.0
        m.step = summary
        m.params_bytes = params_bytes(self.inner)
        m.optimizer_bytes = optimizer_state_bytes(self.optimizer)
        m.activations_bytes = int(median(self._acts_totals)) if self._acts_totals else 0
        m.peak_bytes = max(self._peaks) if self._peaks else 0
        if self._comm is not None:
            m.comm = self._comm.summary(summary["time_ms"])
        counts = None
        if self._example is not None:
            counts = static_counts(self.inner, self._example, backward=self.optimizer is not None,
                                   copy_model=True)
        return assemble_profile(
            m, counts, task=self.task, device=self.device, batch_size=batch, mode="train",
            steps=self._samples,
            config={"every": self.every, "steps_seen": self.state.step, "source": "monitor",
                    **({"sampled_step_ms": sampled_ms} if sampled_ms is not None else {}),
                    **({"max_overhead": self.max_overhead, "gaps": sorted(set(self.gaps))}
                       if self.max_overhead is not None else {})},
        )
