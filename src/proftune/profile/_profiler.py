"""What a profile measures and how: :class:`ProfilePlan` (the detail asked for, the steps, the trace) and
:class:`ProfilerCallback`, the callback that measures them inside the fit loop (per-layer time, memory,
the step's phases, the statistics), for ``profile`` to assemble into a Profile."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._cpplog import filtered_cpp_logs
from .._device import batch_size_of, clock
from .._paths import replacing
from .._tensors import global_grad_norm
from ..train import Callback, FitState
from ._assemble import Measurements
from ._comm import CommRecorder, unwrap
from ._memory import (
    ActivationRecorder,
    PeakMemory,
    collect_young,
    grads_bytes,
    live_bytes,
    optimizer_state_bytes,
    params_bytes,
)
from ._stats import LayerStats
from ._timing import LayerTimer, step_summary


# -- the plan -----------------------------------------------------------------------------------
@dataclasses.dataclass
class ProfilePlan:
    warmup: int
    steps: int
    detail: str
    trace: Path | None
    device: torch.device

    def phase(self, step: int) -> str:
        """The phase of 1-based step ``step``."""
        if step <= self.warmup:
            return "warmup"
        step -= self.warmup
        if step <= self.steps:
            return "clean"
        step -= self.steps
        if self.detail == "full":
            if step <= self.steps:
                return "layers"
            step -= self.steps
        if self.detail != "time":
            if step == 1:
                return "memory"
            step -= 1
        if self.detail == "full":
            if step == 1:
                return "stats"
            step -= 1
        if self.trace is not None and step == 1:
            return "trace"
        return "done"

    @property
    def total(self) -> int:
        n = self.warmup + self.steps + (0 if self.detail == "time" else 1)
        if self.detail == "full":
            n += self.steps + 1
        return n + (1 if self.trace is not None else 0)


class ProfilerCallback(Callback):
    """The profiling callback: runs the plan's phases inside the fit loop (or the inference loop)."""

    def __init__(self, plan: ProfilePlan, *, train: bool) -> None:
        self.plan = plan
        self.train = train
        self.m = Measurements()
        self.timings: list[dict[str, float]] = []
        self.samples: list[int] = []
        self.example: Any = None
        self.batch_size = 0
        self.model: nn.Module | None = None
        self.timer: LayerTimer | None = None
        self.stats: LayerStats | None = None
        self.acts: ActivationRecorder | None = None
        self.peak: PeakMemory | None = None
        self.comm: CommRecorder | None = None
        self.trace_prof: Any = None
        self._trace_quiet = contextlib.ExitStack()
        self._phase = "warmup"
        #: Steps counted by the plan: an epoch's partial last batch is run but not counted (its
        #: time and memory are not those of the batch size asked for).
        self._counted = 0
        self._full: int | None = None
        self._last_end = 0.0
        self._last_cpu = 0.0
        self._capture: Any = None
        self._cuda_peak_open = False
        self._seen = 0

    # -- helpers ------------------------------------------------------------------------------
    def _now(self) -> float:
        return clock(self.plan.device)

    def _capture_input(self, mod: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        if self.example is None:
            self.example = kwargs if (kwargs and not args) else (args[0] if len(args) == 1 else args)

    # -- hooks ----------------------------------------------------------------------------------
    def on_fit_start(self, state: FitState) -> None:
        state.sync_timing = True
        self.model = unwrap(state.model)
        self.timer = LayerTimer(self.model, self.plan.device)
        self.stats = LayerStats(self.model, sample_size=4096)
        self.acts = ActivationRecorder(self.model) if self.train else None
        self.peak = PeakMemory(self.plan.device)
        self._capture = state.model.register_forward_pre_hook(self._capture_input, with_kwargs=True)
        self._last_end, self._last_cpu = self._now(), time.process_time()

    def on_step_start(self, state: FitState) -> None:
        size = batch_size_of(state.batch)
        if self._full is None:
            self._full = size  # the first batch of an epoch is full-size
        partial = size < self._full
        self._phase = phase = "partial" if partial else self.plan.phase(self._counted + 1)
        if self.comm is not None:
            self.comm.recording = phase == "clean"
            self.comm.discard_step()
        if phase == "clean" and self.plan.device.type == "cuda" and not self._cuda_peak_open:
            self._cuda_peak_open = True
            assert self.peak is not None
            self.peak.start()
        elif phase == "layers":
            assert self.timer is not None
            self.timer.attach()
        elif phase == "memory":
            assert self.peak is not None
            if self.acts is not None:
                self.acts.attach()
            if self.plan.device.type == "cpu":
                # the loop frees the old gradients first thing in the step; free them before the
                # window opens so that their release (invisible to the profiler) is not missed
                if state.optimizer is not None:
                    state.optimizer.zero_grad(set_to_none=True)
                collect_young()
                self.peak.start(live_bytes(state.model, state.optimizer, state.batch))
        elif phase == "stats":
            assert self.stats is not None
            self.stats.attach(state.optimizer)
        elif phase == "trace":
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.plan.device.type == "cuda" else [])
            self._trace_quiet.enter_context(filtered_cpp_logs())  # profile_memory's allocator lines
            self.trace_prof = profile(activities=acts, record_shapes=True, profile_memory=True)
            self.trace_prof.__enter__()

    def on_after_backward(self, state: FitState) -> None:
        phase = self._phase
        if phase == "layers" and self.timer is not None:
            self.timer.mark_backward_end()
        if phase in ("clean", "layers"):
            if any(p.grad is not None for p in state.model.parameters()):
                self.m.grad_norms.append(global_grad_norm(state.model))
            self.m.grads_bytes = grads_bytes(state.model)

    def on_step_end(self, state: FitState) -> None:
        phase = self._phase
        now = self._now()
        wall = (now - self._last_end) * 1e3
        # the process's CPU time in the step: another process can delay a step, not add to it
        cpu = (time.process_time() - self._last_cpu) * 1e3
        if self._capture is not None and self.example is not None:
            self._capture.remove()
            self._capture = None
        # samples of this optimizer step (all micro-batches under gradient accumulation)
        n = state.samples_seen - self._seen if self.train else batch_size_of(state.batch)
        self._seen = state.samples_seen
        if phase == "partial":
            self._last_end, self._last_cpu = self._now(), time.process_time()
            return
        self._counted += 1
        following = self.plan.phase(self._counted + 1)
        if phase == "clean":
            self.timings.append({**state.timing, "wall_ms": wall, "cpu_ms": cpu})
            self.samples.append(n)
            self.batch_size = n
            if self.comm is not None:
                self.comm.end_step(step_ms=wall)
            if following != "clean" and self._cuda_peak_open:
                assert self.peak is not None
                self.m.peak_bytes = self.peak.stop()
        elif phase == "layers":
            assert self.timer is not None
            fwd_bwd = state.timing.get("forward_ms", 0.0) + state.timing.get("backward_ms", 0.0)
            self.timer.end_step(fwd_bwd)
            self.timer.detach()
        elif phase == "memory":
            assert self.peak is not None
            if self.acts is not None:
                self.acts.detach()
                self.m.activations_bytes = self.acts.total
                self.m.activation_per_layer = dict(self.acts.per_layer)
            if self.plan.device.type == "cpu":
                self.m.peak_bytes = self.peak.stop()
        elif phase == "stats":
            assert self.stats is not None
            self.stats.detach()
            self.m.stats.append(self.stats.collect(state.optimizer))
            g = self.stats.grad_norm()
            if g is not None:
                self.m.grad_norms.append(g)
            u = self.stats.update_ratio()
            if u is not None:
                self.m.update_ratios.append(u)
        elif phase == "trace" and self.trace_prof is not None:
            prof, self.trace_prof = self.trace_prof, None
            with self._trace_quiet:
                prof.__exit__(None, None, None)
            assert self.plan.trace is not None
            with replacing(self.plan.trace) as tmp:  # kineto logs a failure and returns: checked there
                prof.export_chrome_trace(str(tmp))
        if following == "done":
            state.request_stop("profile complete")
        self._last_end, self._last_cpu = self._now(), time.process_time()

    def on_fit_end(self, state: FitState) -> None:
        self.m.optimizer_bytes = optimizer_state_bytes(state.optimizer)
        self.m.params_bytes = params_bytes(unwrap(state.model))
        self._cleanup()

    def on_exception(self, state: FitState, exc: BaseException) -> None:
        self._cleanup()

    def _cleanup(self) -> None:
        for part in (self.timer, self.stats, self.acts):
            if part is not None:
                part.detach()
        if self.peak is not None:
            self.peak.abort()
        if self._capture is not None:
            self._capture.remove()
            self._capture = None
        if self.trace_prof is not None:
            prof, self.trace_prof = self.trace_prof, None
            try:
                with self._trace_quiet:
                    prof.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - the run already failed; the trace is lost, the error is not
                pass

    def measurements(self) -> Measurements:
        m = self.m
        m.step = step_summary(self.timings, self.samples)
        if self.timer is not None and self.timer.steps:
            m.take_layers(self.timer)
        if self.comm is not None:
            m.comm = self.comm.summary(m.step["time_ms"])
        return m
