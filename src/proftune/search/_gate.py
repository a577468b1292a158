"""Profile-gated trials: measure a configuration for a few steps before any training is spent.

The gate asks :func:`proftune.profile` (``detail="step"``: step time, peak memory, params, MACs)
for the metrics the hard constraints name. A configuration that breaks one ends at once as
infeasible with the measured reason; the measured values also go to Optuna's constraint
interface so that the sampler learns where the feasible region lies.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..task import Task
from ..train import Callback, FitState, fit
from ._constraints import STATIC_METRICS, Constraint

__all__ = ["GateResult", "ProfileGate", "free_memory", "is_oom"]


@dataclass
class GateResult:
    """What the gate measured and decided for one configuration."""

    metrics: dict[str, float]
    violations: dict[str, float]
    reasons: list[str]
    duration_s: float
    source: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.violations.values())


class ProfileGate:
    """Profiles a configuration for ``steps`` steps and checks the hard (profile) constraints."""

    def __init__(self, constraints: Sequence[Constraint], *, needed: Sequence[str] = (),
                 steps: int = 3, warmup: int = 1, device: str | torch.device = "auto",
                 seed: int = 0) -> None:
        self.constraints = [c for c in constraints if c.is_profile]
        self.needed = sorted({c.metric for c in self.constraints} | set(needed))
        self.steps, self.warmup, self.device, self.seed = steps, warmup, device, seed
        self._warmed = False

    @property
    def active(self) -> bool:
        """Whether there is anything to measure."""
        return bool(self.needed)

    def check(self, task: Task, params: dict[str, Any]) -> GateResult:
        """Measure ``params`` on ``task`` and evaluate the constraints (may raise OOM).

        The cheapest measurement that yields the needed metrics: static counts alone (no step)
        for params/MACs/FLOPs/size; a few timed steps of the fit loop for step time,
        throughput and gradient figures; :func:`proftune.profile` (``detail="step"``) when the
        memory peak is needed. Static constraints are checked first, so a configuration that
        breaks one never runs a step.
        """
        started = time.perf_counter()
        needed = set(self.needed)
        static_needed = needed & set(STATIC_METRICS)
        metrics: dict[str, float] = {}
        sources = []
        if static_needed:
            metrics.update(_static_metrics(task, params))
            sources.append("static")
        violations, reasons = self._evaluate(metrics)
        dynamic = needed - set(metrics)
        if dynamic and not any(v > 0 for v in violations.values()):
            if not self._warmed:
                # the first steps of a process pay for lazy kernel and allocator set-up
                _step_metrics(task, params, steps=1, warmup=1, device=self.device, seed=self.seed,
                              memory="peak_memory_bytes" in dynamic)
                self._warmed = True
            step = _step_metrics(task, params, steps=self.steps, warmup=self.warmup,
                                 device=self.device, seed=self.seed,
                                 memory="peak_memory_bytes" in dynamic)
            metrics = {**step, **{k: v for k, v in metrics.items() if k not in step}}
            sources.append("profile" if "peak_memory_bytes" in dynamic else "steps")
            violations, reasons = self._evaluate(metrics)
            missing = [c.text for c in self.constraints if c.metric not in metrics]
            if missing:
                raise RuntimeError(f"the profile gave no value for constraint(s) {missing}; "
                                   f"measured: {', '.join(sorted(metrics))}.")
        return GateResult(metrics=metrics, violations=violations, reasons=reasons,
                          duration_s=time.perf_counter() - started, source="+".join(sources))

    def _evaluate(self, metrics: dict[str, float]) -> tuple[dict[str, float], list[str]]:
        violations: dict[str, float] = {}
        reasons: list[str] = []
        for c in self.constraints:
            if c.metric not in metrics:
                continue
            v = c.violation(float(metrics[c.metric]))
            violations[c.key] = v
            if v > 0:
                reasons.append(c.reason(float(metrics[c.metric])))
        return violations, reasons


def _profile_api() -> Any:
    """``proftune.profile`` when the profiler is installed in this tree, else None."""
    try:
        from ..profile import profile as fn
    except ImportError:  # pragma: no cover
        return None
    return fn if callable(fn) else None


def _count_api() -> Any:
    try:
        from proftune.profile import count_model
    except ImportError:
        return None
    return count_model


def _static_metrics(task: Task, params: dict[str, Any]) -> dict[str, float]:
    """Params, MACs and FLOPs counted on the model built for ``params`` (no step run)."""
    merged = {**task.default_params, **params}
    torch.manual_seed(0)
    model = task.build_model(merged)
    count_model = _count_api()
    if count_model is None:
        n = sum(p.numel() for p in model.parameters())
        return {"params": float(n), "size_bytes": float(sum(p.numel() * p.element_size()
                                                            for p in model.parameters()))}
    batch = task.example_batch(int(merged.get("batch_size", 32)))
    example = batch[0] if isinstance(batch, (tuple, list)) else batch
    counts = count_model(model, example)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"params": float(counts.params_total), "macs": float(counts.macs),
            "flops": float(counts.flops), "size_bytes": float(size)}


def _step_metrics(task: Task, params: dict[str, Any], *, steps: int, warmup: int,
                  device: str | torch.device, seed: int, memory: bool) -> dict[str, float]:
    """Step metrics: :func:`proftune.profile` when the memory peak is asked, else timed fit steps.

    ``profile(detail="step")`` also measures the step's memory with ``torch.profiler``, which
    costs more than training a small configuration for an epoch on CPU; without a memory
    constraint the gate times the steps of the fit loop alone.
    """
    profile = _profile_api()
    if memory and profile is not None:
        p = profile(task, params=params, batch_size=params.get("batch_size"), steps=steps,
                    warmup=warmup, device=device, seed=seed, detail="step")
        return {k: float(v) for k, v in p.metrics().items() if v is not None}
    return _measure_with_fit(task, params, steps=steps, warmup=warmup, device=device, seed=seed)


class _StepMeter(Callback):
    """Step times after warm-up, the global gradient norm and the device's peak memory."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.step_ms: list[float] = []
        self.grad_norms: list[float] = []
        self.samples: list[int] = []
        self.params = 0

    def on_fit_start(self, state: FitState) -> None:
        state.sync_timing = True
        self.params = sum(p.numel() for p in state.model.parameters())
        if state.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(state.device)

    def on_after_backward(self, state: FitState) -> None:
        if state.step >= self.warmup:
            grads = [p.grad.detach().norm() for p in state.model.parameters() if p.grad is not None]
            if grads:
                self.grad_norms.append(float(torch.stack(grads).norm()))

    def on_step_end(self, state: FitState) -> None:
        if state.step > self.warmup:
            self.step_ms.append(state.timing["step_ms"])
            self.samples.append(state.curves["step"][-1]["samples"])


def _measure_with_fit(task: Task, params: dict[str, Any], *, steps: int, warmup: int,
                      device: str | torch.device, seed: int) -> dict[str, float]:
    """Fallback while ``proftune.profile`` is absent: time a few steps of the fit loop."""
    meter = _StepMeter(warmup)
    result = fit(task, params, max_steps=warmup + steps, evaluate=False, device=device, seed=seed,
                 callbacks=[meter])
    out: dict[str, float] = {"params": float(meter.params)}
    if meter.step_ms:
        ms = statistics.median(meter.step_ms)
        out["step_time_ms"] = ms
        out["throughput"] = statistics.mean(meter.samples) / (ms / 1e3) if ms > 0 else 0.0
    if meter.grad_norms:
        out["grad_norm"] = statistics.mean(meter.grad_norms)
        out["grad_var"] = statistics.pvariance(meter.grad_norms) if len(meter.grad_norms) > 1 else 0.0
    if str(result.device).startswith("cuda"):
        out["peak_memory_bytes"] = float(torch.cuda.max_memory_allocated(result.device))
    return out


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is an out-of-memory error of the device (or the host allocator)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def free_memory() -> None:
    """Return cached blocks to the device so one trial's memory does not shrink the next.

    A young-generation collection frees a trial's model and optimizer (they hold no old
    cycles); the full collection, which costs about a second in a process that imported torch
    and scikit-learn, runs only when device memory is still held after it.
    """
    gc.collect(1)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        if torch.cuda.memory_allocated() > 0:
            gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
