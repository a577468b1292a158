"""Profile-gated trials: measure a configuration before any training is spent on it.

The gate produces every profile metric of the registry (:mod:`proftune.metrics`) that a hard
constraint or an objective names, each by the cheapest measurement that yields it:

- ``static`` (``params``, ``macs``, ``flops``, ``size_bytes``): counted on the built model by the
  one FLOP counter (:func:`proftune.profile.count_model`), no step run;
- ``step`` (``step_time_ms``, ``throughput``, ``grad_norm``, ``grad_var``, ``peak_memory_bytes``):
  a :class:`~proftune.profile.Profile` of a few training steps through the fit loop,
  ``detail="time"``, or ``detail="step"`` when the memory peak is needed;
- ``inference`` (``latency_ms``): a Profile of the forward pass at batch 1 in eval mode.

Static constraints are checked first, so a configuration that breaks one never runs a step. A
configuration that breaks a constraint ends at once as infeasible with the measured reason; the
measured values also go to Optuna's constraint interface so that the sampler learns where the
feasible region lies.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..metrics import METRICS
from ..task import Task
from ._constraints import Constraint

__all__ = ["GATE_STAGES", "GateResult", "ProfileGate", "free_memory", "is_oom"]

#: The stages the gate measures, cheapest first.
GATE_STAGES = ("static", "step", "inference")


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


def _stage_of(metric: str) -> str:
    producers = METRICS[metric].producers
    return next(s for s in GATE_STAGES if s in producers)


class ProfileGate:
    """Measures a configuration's profile metrics and checks the hard (profile) constraints."""

    def __init__(self, constraints: Sequence[Constraint], *, needed: Sequence[str] = (),
                 steps: int = 3, warmup: int = 1, device: str | torch.device = "auto",
                 seed: int = 0) -> None:
        self.constraints = [c for c in constraints if c.is_profile]
        self.needed = sorted({c.metric for c in self.constraints} | set(needed))
        unknown = [m for m in self.needed if m not in METRICS or not METRICS[m].is_profile]
        if unknown:
            raise ValueError(f"the gate measures profile metrics only, but got {unknown}.")
        self.steps, self.warmup, self.device, self.seed = steps, warmup, device, seed
        self._warmed = False

    @property
    def active(self) -> bool:
        """Whether there is anything to measure."""
        return bool(self.needed)

    def check(self, task: Task, params: dict[str, Any]) -> GateResult:
        """Measure ``params`` on ``task`` and evaluate the constraints (may raise OOM).

        Stages run cheapest first (static counts, a profiled step, an inference timing) and stop
        at the first stage whose metrics break a constraint.
        """
        started = time.perf_counter()
        merged = {**task.default_params, **params}
        metrics: dict[str, float] = {}
        sources: list[str] = []
        violations: dict[str, float] = {}
        reasons: list[str] = []
        measure: dict[str, Callable[[set[str]], dict[str, float]]] = {
            "static": lambda want: _static_metrics(task, merged),
            "step": lambda want: self._step_metrics(task, merged, memory="peak_memory_bytes" in want),
            "inference": lambda want: self._inference_metrics(task, merged),
        }
        for stage in GATE_STAGES:
            want = {m for m in self.needed if _stage_of(m) == stage}
            if not want:
                continue
            measured = measure[stage](want)
            for key, value in measured.items():  # a cheaper stage's value stands
                metrics.setdefault(key, value)
            sources.append(stage)
            violations, reasons = self._evaluate(metrics)
            if reasons:
                break
        else:
            missing = [m for m in self.needed if m not in metrics]
            if missing:
                raise RuntimeError(f"the profile gave no value for {missing}; measured: "
                                   f"{', '.join(sorted(metrics))}.")
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

    def _warmup(self) -> int:
        """One more unmeasured step on the first call: a process's first steps pay for lazy set-up."""
        extra = 0 if self._warmed else 1
        self._warmed = True
        return self.warmup + extra

    def _step_metrics(self, task: Task, params: dict[str, Any], *, memory: bool) -> dict[str, float]:
        """A Profile of a few training steps: ``detail="step"`` when the memory peak is asked.

        ``detail="step"`` adds a memory step under ``torch.profiler`` on CPU, which costs more
        than training a small configuration for an epoch; without a memory constraint the gate
        reads the cheaper ``detail="time"``.
        """
        from ..profile import profile

        p = profile(task, params=params, batch_size=params.get("batch_size"), steps=self.steps,
                    warmup=self._warmup(), device=self.device, seed=self.seed,
                    detail="step" if memory else "time")
        return {k: float(v) for k, v in p.metrics().items() if v is not None}

    def _inference_metrics(self, task: Task, params: dict[str, Any]) -> dict[str, float]:
        """``latency_ms``: the forward pass at batch 1 in eval mode (median of the timed steps)."""
        from ..profile import profile

        p = profile(task, params=params, batch_size=1, steps=max(self.steps, 5), warmup=self._warmup(),
                    inference=True, device=self.device, seed=self.seed, detail="time")
        return {"latency_ms": float(p.step.forward_ms)}


def _static_metrics(task: Task, params: dict[str, Any]) -> dict[str, float]:
    """Params, MACs, FLOPs (the one FLOP counter) and bytes of the model built for ``params``."""
    from ..profile import count_model

    torch.manual_seed(0)
    model = task.build_model(params)
    model.eval()  # a count at any batch size: BatchNorm in train mode refuses a batch of 1
    batch = task.example_batch(int(params.get("batch_size", 32)))
    example = batch[0] if isinstance(batch, (tuple, list)) else batch
    counts = count_model(model, example)
    size = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    return {"params": float(counts.params_total), "macs": float(counts.macs),
            "flops": float(counts.flops), "size_bytes": float(size)}


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
