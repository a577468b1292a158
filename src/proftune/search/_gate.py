"""Profile-gated trials: measure a configuration before any training is spent on it.

The gate produces every profile metric of the registry (:mod:`proftune.metrics`) that a hard
constraint or an objective names, each by the cheapest measurement that yields it:

- ``static`` (``params``, ``macs``, ``flops``, ``size_bytes``): counted on the built model by the
  one FLOP counter (:func:`proftune.profile.count_model`) and the one size producer
  (:func:`proftune.profile.size_bytes`: the bytes of the state dict as saved), no step run;
- ``step`` (``step_time_ms``, ``throughput``, ``grad_norm``, ``grad_var``, ``peak_memory_bytes``):
  a :class:`~proftune.profile.Profile` of a few training steps through the fit loop,
  ``detail="time"``, or ``detail="step"`` when the memory peak is needed;
- ``inference`` (``latency_ms``): the one latency producer
  (:func:`proftune.profile.task_latencies`), the forward at batch 1 in eval mode, as compress
  and optimize measure it.

Static constraints are checked first, so a configuration that breaks one never runs a step. A
configuration that breaks a constraint ends at once as infeasible with the measured reason; the
measured values also go to Optuna's constraint interface so that the sampler learns where the
feasible region lies.

Time is measured so that the machine's load does not decide. ``step_time_ms`` and
``throughput``: after the warm-up, :data:`TIMED_STEPS` steps are timed and the fastest one
counts (load only ever adds time). On CPU the steps run at one intra-op thread and the value is
the step's CPU time: another process can delay such a step but cannot add to the CPU time it
needs, while at several threads the waiting threads spin and both the wall and the CPU time grow
with the load (a 64-wide MLP step: 1.2 ms alone, 270-300 ms beside 8 other jobs on 2 cores).
``latency_ms`` is its producer's median of interleaved forwards, by CPU time at one thread too.
The wall time, its spread and the CPU time are kept beside the value (``GateResult.timing``)
and a time reason says how noisy its measurement was.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import torch

from ..metrics import METRICS
from ..task import Task
from ..train import TrainParams
from ._constraints import Constraint

__all__ = ["GATE_STAGES", "TIMED_STEPS", "GateResult", "ProfileGate", "free_memory", "is_oom"]

#: The stages the gate measures, cheapest first.
GATE_STAGES = ("static", "step", "inference")
#: Steps timed per configuration after the warm-up; the fastest is the measurement.
TIMED_STEPS = 5
#: The metrics that are times (or rates of them), with the stage that times them.
TIME_METRICS = {"step_time_ms": "step", "throughput": "step", "latency_ms": "inference"}


class StageTiming(TypedDict, total=False):
    """How a timed stage's time was measured and how noisy it was (ms): ``value_ms`` by ``basis``
    over ``steps`` of ``unit`` (the fastest, or the ``statistic``), beside the wall clock's."""

    basis: str
    threads: int | None
    steps: int
    statistic: str
    unit: str
    value_ms: float
    wall_min_ms: float
    wall_median_ms: float
    noise: float
    cpu_min_ms: float
    cpu_median_ms: float


@dataclass
class GateResult:
    """What the gate measured and decided for one configuration."""

    metrics: dict[str, float]
    violations: dict[str, float]
    reasons: list[str]
    duration_s: float
    source: str
    #: Per timed stage (``step``, ``inference``): how its time was measured and how noisy it was
    #: (``cpu_min_ms`` for the step, ``cpu_median_ms`` for the forwards of ``inference``).
    timing: dict[str, StageTiming] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.violations.values())


def _stage_of(metric: str) -> str:
    producers = METRICS[metric].stages
    return next(s for s in GATE_STAGES if s in producers)


class ProfileGate:
    """Measures a configuration's profile metrics and checks the hard (profile) constraints."""

    def __init__(self, constraints: Sequence[Constraint], *, needed: Sequence[str] = (),
                 steps: int = 3, warmup: int = 1, device: str | torch.device = "auto",
                 seed: int = 0, threads: int | None = 1) -> None:
        self.constraints = [c for c in constraints if c.is_profile]
        self.needed = sorted({c.metric for c in self.constraints} | set(needed))
        unknown = [m for m in self.needed if m not in METRICS or not METRICS[m].is_profile]
        if unknown:
            raise ValueError(f"the gate measures profile metrics only, but got {unknown}.")
        self.steps, self.warmup, self.device, self.seed = steps, warmup, device, seed
        #: CPU intra-op threads of the timed steps: 1 measures the step's CPU time (load-proof);
        #: None keeps the process's setting and measures the wall clock.
        self.threads = threads
        self._warmed = False
        self._timing: dict[str, StageTiming] = {}

    @property
    def active(self) -> bool:
        """Whether there is anything to measure."""
        return bool(self.needed)

    def check(self, task: Task, params: TrainParams | Mapping[str, Any]) -> GateResult:
        """Measure ``params`` on ``task`` and evaluate the constraints (may raise OOM).

        A :class:`~proftune.train.TrainParams` is measured as it is (merged and validated where it
        was made, as a trial does once for the gate and its training); a dict is merged over the
        task's defaults here.

        Stages run cheapest first (static counts, a profiled step, an inference timing) and stop
        at the first stage whose metrics break a constraint.
        """
        started = time.perf_counter()
        self._timing = {}
        merged = params.params if isinstance(params, TrainParams) else {**task.default_params, **params}
        given: TrainParams | dict[str, Any] = params if isinstance(params, TrainParams) else merged
        metrics: dict[str, float] = {}
        sources: list[str] = []
        violations: dict[str, float] = {}
        reasons: list[str] = []
        measure: dict[str, Callable[[set[str]], dict[str, float]]] = {
            "static": lambda want: _static_metrics(task, merged),
            "step": lambda want: self._step_metrics(task, given, memory="peak_memory_bytes" in want),
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
                          duration_s=time.perf_counter() - started, source="+".join(sources),
                          timing=dict(self._timing))

    def _evaluate(self, metrics: dict[str, float]) -> tuple[dict[str, float], list[str]]:
        violations: dict[str, float] = {}
        reasons: list[str] = []
        for c in self.constraints:
            if c.metric not in metrics:
                continue
            v = c.violation(float(metrics[c.metric]))
            violations[c.key] = v
            if v > 0:
                timing = self._timing.get(TIME_METRICS.get(c.metric, ""))
                how = f"; {describe_timing(timing)}" if timing else ""
                reasons.append(c.reason(float(metrics[c.metric])) + how)
        return violations, reasons

    def _warmup(self) -> int:
        """One more unmeasured step on the first call: a process's first steps pay for lazy set-up."""
        extra = 0 if self._warmed else 1
        self._warmed = True
        return self.warmup + extra

    def _step_metrics(self, task: Task, params: TrainParams | dict[str, Any], *,
                      memory: bool) -> dict[str, float]:
        """A Profile of a few training steps: ``detail="step"`` when the memory peak is asked.

        ``detail="step"`` adds a memory step under ``torch.profiler`` on CPU, which costs more
        than training a small configuration for an epoch; without a memory constraint the gate
        reads the cheaper ``detail="time"``. Its time: see the module doc.
        """
        from ..profile import profile

        with self._timed_threads() as cpu_basis:
            size = params.batch_size if isinstance(params, TrainParams) else params.get("batch_size")
            p = profile(task, params=params, batch_size=size,
                        steps=max(self.steps, TIMED_STEPS), warmup=self._warmup(), device=self.device,
                        seed=self.seed, detail="step" if memory else "time")
        out = {k: float(v) for k, v in p.metrics().items() if v is not None}
        value = self._record_timing("step", p.step, cpu_basis=cpu_basis)
        if value > 0:
            out["throughput"] = float(p.step.throughput) * float(p.step.time_ms) / value
            out["step_time_ms"] = value
        return out

    def _inference_metrics(self, task: Task, params: dict[str, Any]) -> dict[str, float]:
        """``latency_ms`` from its one producer: the forward at batch 1 in eval mode on the inputs
        the task's loss feeds the model (see :mod:`proftune.profile`)."""
        from .._device import resolve_device
        from ..profile import task_latencies

        torch.manual_seed(self.seed)
        model = task.build_model(params)
        t = task_latencies(task, model, (1,), device=resolve_device(self.device), threads=self.threads,
                           rounds=TIMED_STEPS)[1]
        self._timing["inference"] = {
            "basis": t.basis, "threads": t.threads, "steps": t.forwards, "statistic": "median",
            "unit": "forwards", "value_ms": t.ms, "wall_min_ms": t.wall_min_ms,
            "wall_median_ms": t.wall_median_ms, "noise": t.noise, "cpu_median_ms": t.cpu_median_ms,
        }
        return {"latency_ms": t.ms}

    @contextlib.contextmanager
    def _timed_threads(self) -> Iterator[bool]:
        """On CPU with ``threads`` set: run the timed steps at that many intra-op threads and
        yield True (the CPU time is the measurement); else yield False (the wall clock is)."""
        from .._device import resolve_device

        if self.threads is None or resolve_device(self.device).type != "cpu":
            yield False
            return
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield self.threads == 1
        finally:
            torch.set_num_threads(before)

    def _record_timing(self, stage: str, step: Any, *, cpu_basis: bool) -> float:
        """The step's time by the chosen basis (fastest of the timed steps), and how it was got."""
        value = float(step.cpu_min_ms if cpu_basis else step.min_ms)
        self._timing[stage] = {
            "basis": "cpu time, 1 thread" if cpu_basis else "wall clock",
            "threads": self.threads if cpu_basis else torch.get_num_threads(),
            "steps": max(self.steps, TIMED_STEPS), "value_ms": value,
            "wall_min_ms": float(step.min_ms), "wall_median_ms": float(step.time_ms),
            "noise": float(step.noise), "cpu_min_ms": float(step.cpu_min_ms),
        }
        return value


def describe_timing(t: StageTiming) -> str:
    """One line saying how a time was measured and how noisy it was."""
    return (f"measured as the {t.get('statistic', 'fastest')} of {t['steps']} {t.get('unit', 'steps')} "
            f"by {t['basis']} ({t['value_ms']:.3g} ms); "
            f"wall {t['wall_min_ms']:.3g}-{t['wall_median_ms']:.3g} ms (min-median, noise {t['noise']:+.0%})")


def _static_metrics(task: Task, params: dict[str, Any]) -> dict[str, float]:
    """Params, MACs, FLOPs (the one FLOP counter) and the bytes as saved of the model built for
    ``params``."""
    from ..profile import count_model, size_bytes

    torch.manual_seed(0)
    model = task.build_model(params)
    model.eval()  # a count at any batch size: BatchNorm in train mode refuses a batch of 1
    batch = task.example_batch(int(params.get("batch_size", 32)))
    example = batch[0] if isinstance(batch, (tuple, list)) else batch
    counts = count_model(model, example)
    return {"params": float(counts.params_total), "macs": float(counts.macs),
            "flops": float(counts.flops), "size_bytes": float(size_bytes(model))}


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
