"""Predict the memory and time of one training step without running it: the public call.

:class:`StepTracer` (``_trace.py``) runs the fit loop's own step (:func:`proftune.train.run_step`)
on fake tensors; this module turns its trace into a :class:`PredictResult` for a target device
(``_devices.py``: the device table and the roofline), and searches the largest batch that fits
with the memory model ``find_batch_size`` uses (``_memory_model.py``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._device import resolve_device
from .._optimizers import DEFAULT_OPTIMIZER
from .._with_options import with_options
from ..exceptions import ConfigError
from ..profile import ParamCounts
from ..task import Task, load_task
from ..track import Store, optional_store, tracked_run
from ..train import TrainParams
from ._compute import (
    CPU_RANK_THREADS,
    MAX_RANKS_HERE,
    ComputeFigures,
    can_start_ranks,
    measure_compute,
    measure_in_ranks,
)
from ._devices import DeviceSpec, price_phases, resolve_target
from ._link import LinkFigures, measure_link, replayed_calls
from ._memory_model import MIN_MARGIN_FRACTION, MemoryModel, fit_memory_model
from ._parallel import Evaluator, validate_parallel
from ._parallel import plan as run_plan
from ._records import (
    Calibration,
    LayerPrediction,
    MaxBatchProbe,
    MaxBatchSearch,
    ParallelPlan,
    ParallelPrediction,
    PeakAt,
    PredictedMemory,
    PredictedStep,
    PredictResult,
)
from ._sharding import STRATEGIES, Collective
from ._trace import PHASES, MemoryTrace, StepTracer

__all__ = ["PredictConfig", "predict"]


# -- from a trace to a prediction ----------------------------------------------------------------------


def _assemble(trace: MemoryTrace, spec: DeviceSpec, tracer: StepTracer, *, started: float,
              **rest: Any) -> PredictResult:
    """The prediction of one trace on one target: counts, memory, time, layers; ``rest``: its other
    fields; ``trace_s`` the seconds since ``started``."""
    layer_costs, phase_ms, bound = price_phases(trace, spec)
    names = [n for n in trace.layer_types if n in layer_costs or n in trace.activations]
    names += [n for n in layer_costs if n not in names]
    layers = []
    for name in names:
        e = layer_costs.get(name)
        known = e is not None and bool(spec.bandwidth_bytes_s)
        layers.append(LayerPrediction(
            name=name, type=trace.layer_types.get(name, "?"), params=tracer.layer_params.get(name, 0),
            flops=int(e.flops["forward"]) if e else 0,
            backward_flops=int(e.flops["backward"]) if e else 0,
            activation_bytes=int(trace.activations.get(name, 0)),
            forward_ms=float(e.ms["forward"]) if (e and known) else None,
            backward_ms=float(e.ms["backward"]) if (e and known) else None,
            bytes_moved=int(e.bytes) if e else 0,
            bound=e.bound if (e and known) else "unknown",
        ))
    flops = {p: sum(op.flops for op in trace.ops if op.phase == p and (op.micro == 0 or p == "optimizer"))
             for p in PHASES}  # one micro-batch's forward and backward, as count_model counts them
    total_ms = sum(v for v in phase_ms.values() if v is not None) if phase_ms["forward"] is not None else None
    return PredictResult(
        params=ParamCounts(total=tracer.n_params, trainable=tracer.n_trainable),
        flops=flops["forward"], backward_flops=flops["backward"], optimizer_flops=flops["optimizer"],
        memory=PredictedMemory(
            params_bytes=trace.params_bytes, grads_bytes=trace.grads_bytes, optimizer_bytes=trace.optimizer_bytes,
            activations_bytes=sum(trace.activations.values()), peak_bytes=trace.peak,
            buffers_bytes=trace.buffers_bytes, batch_bytes=trace.batch_bytes, static_bytes=trace.static_bytes),
        step=PredictedStep(time_ms=total_ms, forward_ms=phase_ms["forward"], backward_ms=phase_ms["backward"],
                           optimizer_ms=phase_ms["optimizer"]),
        layers=tuple(layers), bound=bound,
        peak=PeakAt(phase=trace.peak_where[0], layer=trace.peak_where[1], op=trace.peak_where[2],
                    breakdown=dict(trace.peak_breakdown)),
        uncounted_ops=tuple(trace.uncounted),
        trace_s=time.perf_counter() - started, **rest)


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
    #: Data parallelism: the GPUs in all (over ``nodes`` nodes), the strategy (ddp, fsdp, zero1,
    #: zero2, zero3), activation checkpointing of the blocks (none, full, selective) and offload
    #: (none, optimizer, params); ``batch_size`` is then the per-GPU micro-batch.
    gpus: int | None = None
    nodes: int | None = None
    strategy: str | None = None
    activation_checkpointing: str = "none"
    offload: str = "none"
    #: Rank every strategy x checkpointing x offload x per-GPU batch that fits ``global_batch``
    #: samples per step on ``gpus`` GPUs, by predicted throughput.
    plan: bool = False
    global_batch: int | None = None
    #: The link the collectives are priced with: ``auto`` (on this machine's CPU ranks, target
    #: ``cpu``: one strategy's own collectives replayed at their sizes between ``gpus`` ranks as they
    #: step, a plan's priced by a sweep between them; the target's datasheet figure otherwise),
    #: ``table`` (the datasheet's), ``measure`` (a short sweep between ``gpus`` ranks of this
    #: machine: gloo, or nccl on as many GPUs), or figures measured before (``LinkFigures`` or its dict).
    link: str | dict[str, object] | LinkFigures = "auto"
    #: The step's compute: ``auto`` (a few steps timed where the ranks would run: for target ``cpu``
    #: and one strategy, ``gpus`` processes stepping together at one thread each, a plan's options
    #: one process each; this CUDA GPU when it is the target),
    #: else the roofline of the target's table entry) or ``roofline``.
    compute: str = "auto"


def predict(
    task: Task | str,
    params: TrainParams | Mapping[str, Any] | None = None,
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
    # a TrainParams was validated where it was made; a dict is merged over the defaults here, once
    over = {k: v for k, v in (("precision", precision), ("optimizer", optimizer)) if v is not None}
    given = ((params.with_params(**over) if over else params) if isinstance(params, TrainParams)
             else TrainParams.of(task_obj, params, **over))
    prec = given.precision or "fp32"
    validate_parallel(gpus=cfg.gpus, nodes=cfg.nodes, strategy=cfg.strategy, checkpointing=cfg.activation_checkpointing,
                      offload=cfg.offload, plan=cfg.plan, global_batch=cfg.global_batch, link=cfg.link,
                      compute=cfg.compute)
    if cfg.plan and not batch_size:
        batch_size, max_batch = 1, False
    if cfg.gpus is not None and cfg.strategy is None and not cfg.plan:
        cfg = dataclasses.replace(cfg, strategy="ddp")
    _validate(batch_size, prec)
    if calibrate is not None and (isinstance(calibrate, bool) or not isinstance(calibrate, int) or calibrate < 1):
        raise ConfigError(f"calibrate must be a positive batch size, but got {calibrate=}.")
    dev = resolve_device(device)
    name = (target or "").strip().lower()
    if name == "auto":
        # numbers given without a name describe another device; else the one proftune runs on
        described = device_memory is not None or peak_tflops is not None or bandwidth is not None
        name = "" if described else _local_target(dev)
    spec = resolve_target(name or None, memory=device_memory, peak_tflops=peak_tflops, bandwidth=bandwidth)
    st = optional_store(store, db=db)
    if st is None:
        return _predict(task_obj, given, prec, spec, batch_size, max_batch=max_batch, foreach=foreach,
                        calibrate=calibrate, dev=dev, cfg=cfg)
    run_config = {"params": given.params, "batch_size": batch_size, "target": spec.to_dict(), "max_batch": max_batch,
                  "calibrate": calibrate, "device": str(dev), "gpus": cfg.gpus, "nodes": cfg.nodes,
                  "strategy": cfg.strategy, "activation_checkpointing": cfg.activation_checkpointing,
                  "offload": cfg.offload, "plan": cfg.plan, "global_batch": cfg.global_batch,
                  "link": cfg.link.to_dict() if isinstance(cfg.link, LinkFigures) else cfg.link,
                  "compute": cfg.compute}
    # a prediction reads the shapes of one sample batch, not the data: no data fingerprint
    with tracked_run("predict", task_obj, config=run_config, device=dev, store=st, fingerprint=False) as run:
        result = dataclasses.replace(_predict(task_obj, given, prec, spec, batch_size, max_batch=max_batch,
                                              foreach=foreach, calibrate=calibrate, dev=dev, cfg=cfg,
                                              task_ref=task if isinstance(task, str) else task_obj),
                                     run_id=run.id)
        metrics = {"predicted_peak_bytes": float(result.memory.peak_bytes), "params": float(result.params.total)}
        if result.step.time_ms is not None:
            metrics["predicted_step_time_ms"] = float(result.step.time_ms)
        if result.max_batch_size is not None:
            metrics["max_batch_size"] = float(result.max_batch_size)
        run.set(metrics=metrics, result=result.to_dict())
    return result


def _predict(task_obj: Task, given: TrainParams, prec: str, spec: DeviceSpec, batch_size: int, *,
             max_batch: bool, foreach: bool | None, calibrate: int | None, dev: torch.device,
             cfg: PredictConfig, task_ref: Task | str | None = None) -> PredictResult:
    """One prediction of validated inputs (see :func:`predict`); ``task_ref``: the task as given
    (a spec string rebuilds it in other processes)."""
    started = time.perf_counter()
    if foreach is None:
        foreach = spec.name not in ("cpu", "custom")
    tracer = _tracer(task_obj, given, prec, foreach, cfg.activation_checkpointing)
    parallel, plan_result = _parallel(task_ref or task_obj, task_obj, given, prec, foreach,
                                      tracer, spec, batch_size, cfg, started,
                                      dev)
    traces: dict[int, MemoryTrace] = {}

    def peak_at(b: int) -> int:
        if b not in traces:
            traces[b] = tracer.cache.get(b) or tracer.trace(b)
            tracer.cache[b] = traces[b]
        return traces[b].peak

    peak_at(batch_size)
    trace = traces[batch_size]
    static = trace.static_bytes
    memory = spec.memory_bytes
    fits = None if memory is None else trace.peak <= memory
    found: MaxBatchSearch | None = None
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
        same = (tracer if tracer.foreach == on_gpu
                else StepTracer(task_obj, given.params, precision=prec, foreach=on_gpu))
        calibration = _calibrate(task_obj, given, same, calibrate, dev)
    return _assemble(
        trace, spec, tracer, started=started,
        task=task_obj.name or type(task_obj).__name__, device=spec.name, batch_size=batch_size, precision=prec,
        optimizer=given.optimizer or DEFAULT_OPTIMIZER, target=spec.to_dict(),
        device_memory_bytes=memory, fits=fits, max_batch_size=max_b, max_batch=found,
        traces=len(traces) + (1 if calibration else 0),
        real_steps=int(calibration["real_steps"]) if calibration else 0, calibration=calibration,
        config={"params": {**given.params, "batch_size": batch_size}}, parallel=parallel, plan=plan_result,
    )


def _parallel(task_ref: Task | str, task_obj: Task, given: TrainParams, prec: str, foreach: bool,
              tracer: StepTracer,
              spec: DeviceSpec, batch_size: int, cfg: PredictConfig, started: float,
              dev: torch.device) -> tuple[ParallelPrediction | None, ParallelPlan | None]:
    """The per-GPU prediction (``strategy``) or the plan, when ``gpus`` is given."""
    if cfg.gpus is None:
        return None, None
    tracers = {cfg.activation_checkpointing: tracer}

    def tracer_for(mode: str) -> StepTracer:
        if mode not in tracers:
            tracers[mode] = StepTracer(task_obj, given.params, precision=prec, foreach=foreach, checkpointing=mode)
        return tracers[mode]

    where, why = _compute_device(cfg, spec, dev)
    # one strategy on this machine's CPU ranks: the ranks themselves step (a few, short) and replay
    # their collectives; a plan's many options each time one process instead
    in_ranks = (where is not None and where.type == "cpu" and not cfg.plan and 2 <= cfg.gpus <= MAX_RANKS_HERE
                and can_start_ranks(task_ref))

    def measure(strategy: str, mode: str, b: int, collectives: list[Collective]) -> ComputeFigures:
        if in_ranks:
            return measure_in_ranks(task_ref, given, ranks=int(cfg.gpus or 1), batch_size=b, checkpointing=mode,
                                    strategy=strategy, calls=replayed_calls(collectives, int(cfg.gpus or 1)))
        threads = CPU_RANK_THREADS if where is not None and where.type == "cpu" else torch.get_num_threads()
        return measure_compute(task_obj, given, batch_size=b, checkpointing=mode, strategy=strategy,
                               device=where or "cpu", threads=threads)

    link = None if in_ranks and cfg.link == "auto" else _resolve_link(cfg, spec)
    ev = Evaluator(tracer_for, spec, cfg.gpus, cfg.nodes or 1, tokens_per_sample=_tokens_per_sample(tracer.sample),
                   link=link, measure=None if where is None else measure, roofline_reason=why)
    if not cfg.plan:
        one = ev.evaluate(STRATEGIES[cfg.strategy or "ddp"], cfg.activation_checkpointing, cfg.offload, batch_size,
                          tracer.grad_accumulation)
        return one, None
    options, rejected = run_plan(ev, int(cfg.global_batch or 0))
    return None, ParallelPlan(gpus=cfg.gpus, nodes=cfg.nodes or 1, global_batch=int(cfg.global_batch or 0),
                              tokens_per_sample=ev.tokens_per_sample, options=tuple(options),
                              rejected=tuple(rejected), traces=ev.traces, seconds=time.perf_counter() - started)


def _compute_device(cfg: PredictConfig, spec: DeviceSpec, dev: torch.device) -> tuple[torch.device | None, str]:
    """Where one process's step is timed for the compute (None: the roofline's), and why not."""
    if cfg.compute == "roofline":
        return None, "compute='roofline'"
    if (cfg.nodes or 1) > 1:
        return None, f"nodes={cfg.nodes}: the ranks are not this machine's"
    if spec.name == "cpu":
        return torch.device("cpu"), ""
    if dev.type == "cuda" and _local_target(dev) == spec.name:
        return dev, ""
    return None, f"no {spec.name} here to measure on"


def _resolve_link(cfg: PredictConfig, spec: DeviceSpec) -> LinkFigures | None:
    """The measured link the collectives are priced with, or None for the target's datasheet figure."""
    link, gpus = cfg.link, int(cfg.gpus or 1)
    if isinstance(link, LinkFigures):
        return link
    if isinstance(link, dict):
        return LinkFigures.from_dict(link)
    if link == "table" or gpus < 2 or (link == "auto" and (spec.name != "cpu" or (cfg.nodes or 1) > 1)):
        return None
    on_gpus = link == "measure" and torch.cuda.is_available() and torch.cuda.device_count() >= gpus
    return measure_link(gpus, backend="nccl" if on_gpus else "gloo")


def _tokens_per_sample(sample: Any) -> int:
    """Tokens of one sample of a sequence model: the length of its first 2-D integer tensor."""
    from torch.utils._pytree import tree_flatten

    for leaf in tree_flatten(sample)[0]:
        if isinstance(leaf, torch.Tensor) and leaf.dim() == 2 and not leaf.dtype.is_floating_point:
            return int(leaf.shape[1])
    return 0


def _largest_batch(trace_at: Callable[[int], tuple[int, dict[str, int]]], budget: int, start: int,
                   *, max_verify: int = 3) -> MaxBatchSearch:
    """The largest batch whose predicted peak plus batch-size's margin fits ``budget``.

    The peak of a step is the highest of its phases' peaks, each linear in the batch (the
    optimizer's does not grow with it): one memory model per phase (:func:`fit_memory_model`,
    margin from its residual, at least 0.5% of the budget) from fake steps at two batch sizes,
    the answer the smallest of the phases' answers, verified by a fake step there; a step over
    the budget joins the fits, and after ``max_verify`` the answer is bisected on fake steps.
    """
    probes: list[MaxBatchProbe] = []
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


def _tracer(task: Task, given: TrainParams, precision: str, foreach: bool,
            checkpointing: str = "none") -> StepTracer:
    """The tracer of the same task object and settings as the last call (a 7B model takes tens
    of seconds to build and trace: asking again for another device reuses its traces)."""
    params = given.params
    key = (id(task), repr(sorted(params.items())), precision, foreach, checkpointing)
    if _LAST and _LAST[0][0] == key and _LAST[0][1].task is task:
        return _LAST[0][1]
    tracer = StepTracer(task, params, precision=precision, foreach=foreach, checkpointing=checkpointing)
    _LAST[:] = [(key, tracer)]
    return tracer


def _calibrate(task: Task, given: TrainParams, tracer: StepTracer, batch_size: int,
               dev: torch.device) -> Calibration:
    """Predicted vs ``profile``'s measurement on ``dev`` (this machine) at ``batch_size``."""
    from ..profile import profile as run_profile

    here = resolve_target(_local_target(dev))
    if dev.type == "cuda" and here.name == "cpu":
        raise ConfigError(f"calibrate on {torch.cuda.get_device_name(dev)} needs its numbers, which the "
                          f"device table lacks; valid: device='cpu', or a GPU among {', '.join(_GPU_KEYS)}.")
    trace = tracer.trace(batch_size)
    _, phase_ms, _ = price_phases(trace, here)
    predicted_ms = sum(v for v in phase_ms.values() if v is not None)
    steps, warmup = 3, 1
    prof = run_profile(task, params=given, batch_size=batch_size, steps=steps, warmup=warmup, device=dev,
                       detail="step")
    measured_ms = float(prof.step.time_ms - prof.step.data_ms)
    measured_peak = int(prof.memory.peak_bytes)
    return Calibration(
        batch_size=batch_size, device=here.name, predicted_peak_bytes=trace.peak, measured_peak_bytes=measured_peak,
        peak_error=trace.peak / measured_peak - 1 if measured_peak else None,
        predicted_step_ms=predicted_ms, measured_step_ms=measured_ms,
        time_error=predicted_ms / measured_ms - 1 if measured_ms > 0 else None, real_steps=steps + warmup)


_GPU_KEYS = ("h200", "h100", "a100", "v100", "l4", "t4")


def _local_target(dev: torch.device) -> str:
    """``auto``: ``dev``'s entry in the device table when it is a CUDA device there, else this CPU."""
    if dev.type == "cuda" and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(dev).lower()
        for key in _GPU_KEYS:
            if key in gpu:
                return key
    return "cpu"
