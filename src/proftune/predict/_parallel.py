"""Training beyond one GPU, predicted: one GPU's memory and the step's time under a data-parallel
strategy (``_sharding.py``), and the plan that ranks every strategy that fits.

The single-device step is traced on fake tensors (with the blocks checkpointed as asked); the
strategy shards the model states of each phase's peak and adds its buffers; the step's time is
the compute at the per-GPU batch (measured where the ranks would run here, ``_compute.py``: on
this machine's CPU ranks the ranks themselves stepping together, their collectives replayed
between them; for a plan one process, slowed by the ranks sharing the cores; else the roofline's),
plus the collectives over the link (replayed, measured, or ``DeviceSpec.intra_node_bytes_s`` within a node,
``inter_node_bytes_s`` across nodes), each hidden behind the phase it overlaps with as the runtime
overlaps it (all but one bucket's or one unit's call, as far as that phase lasts, and on CPU ranks
only where a core is free for it), plus offload's host traffic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import ProblemCollector
from ._checkpointing import CHECKPOINTING
from ._compute import COMPUTE, ComputeFigures, rank_sharing, spare_cores_per_rank, why_not_measured
from ._devices import DeviceSpec, price_phases
from ._link import LinkFigures
from ._memory_model import MIN_MARGIN_FRACTION
from ._records import ComputeSource, LinkUsed, ParallelPrediction, Rejected
from ._sharding import OFFLOAD, STRATEGIES, BaseStrategy, Collective, ModelSizes
from ._trace import MemoryTrace, StepTracer

__all__ = ["Evaluator", "model_sizes", "plan", "validate_parallel"]

#: How the link between GPUs is found (or figures measured before, ``LinkFigures``).
LINKS = ("auto", "table", "measure")
#: Host memory bandwidth one GPU's share of an offloaded optimizer step streams at (bytes/s).
HOST_OPTIMIZER_BYTES_S = 50e9


def validate_parallel(*, gpus: Any, nodes: Any, strategy: Any, checkpointing: Any, offload: Any,
                      plan: bool, global_batch: Any, link: Any = "auto", compute: Any = "auto") -> None:
    """One ConfigError naming every problem of the parallel options."""
    problems = ProblemCollector()
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        problems.add(f"gpus must be a positive integer, but got {gpus=}.")
    if nodes is not None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            problems.add(f"nodes must be a positive integer, but got {nodes=}.")
        elif gpus is None:
            problems.add(f"nodes={nodes} needs gpus= (the GPUs in all, over the nodes).")
        elif isinstance(gpus, int) and gpus >= 1 and gpus % nodes:
            problems.add(f"gpus={gpus} is not a multiple of nodes={nodes} (the same GPUs on every node).")
    names = ", ".join(STRATEGIES)
    if strategy is not None and strategy not in STRATEGIES:
        problems.add(f"strategy={strategy!r} is unknown; valid: {names}.")
    if checkpointing not in CHECKPOINTING:
        problems.add(f"activation_checkpointing={checkpointing!r} is unknown; valid: {', '.join(CHECKPOINTING)}.")
    if offload not in OFFLOAD:
        problems.add(f"offload={offload!r} is unknown; valid: {', '.join(OFFLOAD)}.")
    elif strategy in STRATEGIES and offload not in STRATEGIES[strategy].offloads:
        problems.add(f"offload={offload!r} does not go with strategy={strategy!r}; valid for it: "
                     f"{', '.join(STRATEGIES[strategy].offloads)}.")
    if (strategy is not None or checkpointing != "none" or offload != "none") and gpus is None and not plan:
        problems.add("strategy=, activation_checkpointing= and offload= need gpus= (the data-parallel GPUs).")
    _timing_problems(problems, gpus=gpus, link=link, compute=compute)
    if plan:
        _plan_problems(problems, gpus=gpus, strategy=strategy, global_batch=global_batch)
    if global_batch is not None and (isinstance(global_batch, bool) or not isinstance(global_batch, int)
                                     or global_batch < 1):
        problems.add(f"global_batch must be a positive integer, but got {global_batch=}.")
    problems.raise_if_any()


def _timing_problems(problems: ProblemCollector, *, gpus: Any, link: Any, compute: Any) -> None:
    if not isinstance(link, (dict, LinkFigures)) and link not in LINKS:
        problems.add(f"link={link!r} is unknown; valid: {', '.join(LINKS)}, or measured LinkFigures.")
    elif link == "measure" and (gpus is None or (isinstance(gpus, int) and gpus < 2)):
        problems.add(f"link='measure' needs gpus= of at least 2 (the ranks to measure between), but got {gpus=}.")
    if compute not in COMPUTE:
        problems.add(f"compute={compute!r} is unknown; valid: {', '.join(COMPUTE)}.")


def _plan_problems(problems: ProblemCollector, *, gpus: Any, strategy: Any, global_batch: Any) -> None:
    if gpus is None:
        problems.add("plan=True needs gpus= (the GPUs to plan for).")
    if global_batch is None:
        problems.add("plan=True needs global_batch= (samples per optimizer step over all GPUs).")
    elif isinstance(gpus, int) and isinstance(global_batch, int) and gpus >= 1 and global_batch % gpus:
        problems.add(f"global_batch={global_batch} is not a multiple of gpus={gpus}.")
    if strategy is not None:
        problems.add(f"plan=True ranks every strategy; leave strategy= out (got {strategy=}).")


# -- the per-GPU arithmetic over traces ----------------------------------------------------------------


def model_sizes(tracer: StepTracer, trace: MemoryTrace) -> ModelSizes:
    """The model states of a trace and the parameter bytes of each unit (FSDP's blocks)."""
    per = trace.params_bytes / max(tracer.n_params, 1)
    units = tuple(int(per * sum(v for k, v in tracer.layer_params.items() if k == u or k.startswith(u + ".")))
                  for u in tracer.units)
    return ModelSizes(n_params=tracer.n_params, params_bytes=trace.params_bytes, grads_bytes=trace.grads_bytes,
                      optimizer_bytes=trace.optimizer_bytes, unit_bytes=units,
                      root_bytes=max(0, trace.params_bytes - sum(units)),
                      largest_layer_params=max(tracer.layer_params.values(), default=0))


@dataclass
class _Point:
    """What a trace at one per-GPU batch gives: each phase's breakdown, phase ms, activations."""

    breakdowns: dict[str, dict[str, int]]
    phase_ms: dict[str, float | None]
    activations: int
    #: Backward's breakdowns by the single device's gradient bytes then (``MemoryTrace.grad_moments``).
    moments: dict[int, dict[str, int]] = field(default_factory=dict)
    #: Micro-batches the trace ran (``phase_ms`` holds all of them).
    micro_batches: int = 1


@dataclass
class Evaluator:
    """Prices (strategy, checkpointing, offload, per-GPU batch, micro-batches) on a target from
    fake-traced steps, one tracer per checkpointing mode, traces cached by batch size."""

    tracer_for: Callable[[str], StepTracer]
    spec: DeviceSpec
    gpus: int
    nodes: int
    tokens_per_sample: int = 0
    #: The link measured between this machine's ranks (``_link.measure_link``); None: the
    #: target's datasheet figure (``DeviceSpec.intra_node_bytes_s`` / ``inter_node_bytes_s``).
    link: LinkFigures | None = None
    #: Times the step's compute at (strategy, checkpointing, per-GPU batch, its collectives) where
    #: the ranks would run (``_compute.measure_compute``: one process; ``measure_in_ranks``: the
    #: ranks themselves, their collectives replayed between them); None: the roofline's compute,
    #: for ``roofline_reason``.
    measure: Callable[[str, str, int, list[Collective]], ComputeFigures] | None = None
    roofline_reason: str = "compute='roofline'"
    measured: dict[tuple[str, str, int, int], ComputeFigures | str] = field(default_factory=dict)
    points: dict[tuple[str, int], _Point] = field(default_factory=dict)
    traces: int = 0

    def point(self, checkpointing: str, b: int, *, exact: bool = True) -> _Point:
        key = (checkpointing, b)
        if key in self.points:
            return self.points[key]
        if not exact:
            lo, hi = self.point(checkpointing, 1), self.point(checkpointing, 2)
            return _line(lo, hi, b)
        tracer = self.tracer_for(checkpointing)
        trace = tracer.cache.get(b) or tracer.trace(b)
        tracer.cache[b] = trace
        self.traces += 1
        _, phase_ms, _ = price_phases(trace, self.spec)
        self.points[key] = _Point({k: dict(v) for k, v in trace.phase_breakdowns.items()}, phase_ms,
                                  sum(trace.activations.values()), dict(trace.grad_moments),
                                  trace.micro_batches)
        return self.points[key]

    def sizes(self, checkpointing: str) -> ModelSizes:
        tracer = self.tracer_for(checkpointing)
        self.point(checkpointing, 1)
        return model_sizes(tracer, tracer.cache[1])

    def evaluate(self, strategy: BaseStrategy, checkpointing: str, offload: str, b: int, micro: int,
                 *, exact: bool = True) -> ParallelPrediction:
        n, s = self.gpus, self.sizes(checkpointing)
        pt = self.point(checkpointing, b, exact=exact)
        phases = strategy.phase_bytes(s, n, offload, pt.breakdowns, accumulating=micro > 1, moments=pt.moments)
        peak = max(phases, key=lambda p: p.total)
        memory = self.spec.memory_bytes
        plain = self.point("none", b, exact=exact) if checkpointing != "none" else pt
        figures = self._measured(strategy, checkpointing, b, micro, pt, exact=exact)
        step = self._time(strategy, s, offload, pt, micro, figures)
        global_batch = b * micro * n
        time_ms = step.get("time_ms")
        per_s = global_batch / (float(time_ms) / 1e3) if time_ms else None
        gpn = n // self.nodes
        ds = strategy.deepspeed(s.n_params, s.largest_layer_params, gpn, self.nodes, offload)
        buffers = sum(v for k, v in peak.breakdown.items() if k in ("comm_buckets", "gathered_params"))
        return ParallelPrediction(
            strategy=strategy.name, gpus=n, nodes=self.nodes, activation_checkpointing=checkpointing,
            offload=offload, batch_size=b, micro_batches=micro, global_batch=global_batch,
            memory=dict(peak.breakdown), peak_bytes=peak.total, peak_phase=peak.phase,
            phase_peaks={p.phase: p.total for p in phases}, model_states=strategy.model_states(s, n, offload),
            activations_bytes=pt.activations, activations_without_checkpointing_bytes=plain.activations,
            comm_buffers_bytes=buffers, device_memory_bytes=memory,
            fits=None if memory is None else peak.total <= memory,
            max_batch_size=self._max_batch(strategy, checkpointing, offload, micro) if memory else None,
            step=step, samples_per_s=per_s,
            tokens_per_s=per_s * self.tokens_per_sample if (per_s and self.tokens_per_sample) else None,
            collectives=tuple(c.to_dict() for c in strategy.collectives(s, n, micro)),
            link=self._link(figures), compute=self._compute(strategy.name, checkpointing, b, micro, figures),
            deepspeed=ds.to_dict(),
            n_params=s.n_params,
            largest_layer_params=s.largest_layer_params,
            note="" if exact else "batch between traced ones: per-kind line through batches 1 and 2",
        )

    def _link(self, figures: ComputeFigures | None = None) -> LinkUsed:
        """The link figure the collectives were priced with, and where it comes from."""
        if self.link is None and figures is not None and figures.collectives_ms:
            return {"name": f"replayed gloo ({figures.ranks} ranks)", "bytes_s": None, "overlaps": False,
                    "source": f"measured: the step's collectives replayed at their sizes and launches between "
                              f"the {figures.ranks} CPU processes that stepped together, back to back, median of 3",
                    "collectives_ms": dict(figures.collectives_ms)}
        if self.link is not None:
            return {"name": f"measured {self.link.backend} ({self.link.ranks} ranks)", "bytes_s": self.link.bytes_s,
                    "source": self.link.source, "overlaps": self.link.overlaps,
                    "collectives": self.link.collectives}
        across = self.nodes > 1
        bw = self.spec.inter_node_bytes_s if across else self.spec.intra_node_bytes_s
        return {"name": "inter-node" if across else "intra-node", "bytes_s": bw, "source": self.spec.link_source,
                "overlaps": True}

    def _measured(self, strategy: BaseStrategy, checkpointing: str, b: int, micro: int, pt: _Point, *,
                  exact: bool) -> ComputeFigures | None:
        """One process's measured phases at per-GPU batch ``b``, or None where the roofline prices
        the compute (nothing can be measured, or the step is too large to time here)."""
        if self.measure is None:
            return None
        if not exact:  # a batch between traced ones: the line through the measured 1 and 2
            lo = self._measured(strategy, checkpointing, 1, micro, self.point(checkpointing, 1), exact=True)
            hi = self._measured(strategy, checkpointing, 2, micro, self.point(checkpointing, 2), exact=True)
            if lo is None or hi is None:
                return None
            at = {k: max(0.0, getattr(lo, k) + (getattr(hi, k) - getattr(lo, k)) * (b - 1))
                  for k in ("forward_ms", "backward_ms", "optimizer_ms")}
            return ComputeFigures(lo.device, lo.threads, b, checkpointing, steps=lo.steps, wrapped=lo.wrapped,
                                  cpu_share=lo.cpu_share, ranks=lo.ranks, collectives_ms=lo.collectives_ms,
                                  between_collectives=lo.between_collectives, **at)
        key = (strategy.name, checkpointing, b, micro)
        if key not in self.measured:
            peak = max((sum(v.values()) for v in pt.breakdowns.values()), default=0)
            known = [v for v in pt.phase_ms.values() if v is not None]
            why = why_not_measured(peak, sum(known) if known else None)
            self.measured[key] = why or self.measure(strategy.name, checkpointing, b,
                                                     strategy.collectives(self.sizes(checkpointing), self.gpus, micro))
        got = self.measured[key]
        return got if isinstance(got, ComputeFigures) else None

    def _compute(self, strategy: str, checkpointing: str, b: int, micro: int,
                 figures: ComputeFigures | None) -> ComputeSource:
        """Where the step's compute figure comes from, as the plan states it beside the link."""
        sharing = self._sharing(figures)
        if figures is not None:
            return {"name": "measured", "source": figures.source, "device": figures.device,
                    "threads_per_rank": figures.threads, "cpu_share": figures.cpu_share, "sharing": sharing,
                    "ranks_measured": figures.ranks,
                    "forward_ms": figures.forward_ms, "backward_ms": figures.backward_ms,
                    "optimizer_ms": figures.optimizer_ms}
        why = self.measured.get((strategy, checkpointing, b, micro))
        reason = why if isinstance(why, str) and why else self.roofline_reason
        return {"name": "roofline", "source": f"roofline of the {self.spec.name} table entry ({reason})",
                "sharing": sharing}

    def _time(self, strategy: BaseStrategy, s: ModelSizes, offload: str, pt: _Point, micro: int,
              figures: ComputeFigures | None = None) -> dict[str, float | None]:
        if figures is not None:
            fwd, bwd, opt = figures.forward_ms, figures.backward_ms, figures.optimizer_ms
        else:
            traced = [pt.phase_ms.get(p) for p in ("forward", "backward", "optimizer")]
            if any(v is None for v in traced):
                return {"compute_ms": None, "comm_ms": None, "exposed_comm_ms": None, "offload_ms": None,
                        "time_ms": None}
            # the trace's phase times hold its micro-batches: one micro-batch's, for ``micro`` of them
            fwd, bwd, opt = (float(traced[0] or 0) / pt.micro_batches, float(traced[1] or 0) / pt.micro_batches,
                             float(traced[2] or 0))
        n = self.gpus
        sharing = self._sharing(figures)
        opt_ms = opt / n if strategy.shards_optimizer else opt
        if strategy.shards_optimizer and figures is not None and figures.wrapped and figures.world == n:
            opt_ms = opt  # measured on a rank's own shards
        elif strategy.shards_optimizer and figures is not None and figures.wrapped:
            # measured as one rank of a group of itself: the same tensors as a rank's, whole; only
            # their elements' part (the roofline's, the most it can be) shrinks to a shard
            elements = min(opt, float(pt.phase_ms.get("optimizer") or 0))
            opt_ms = opt - elements + elements / n
        offload_ms = 0.0
        if offload != "none":
            opt_ms = 0.0
            host = self.spec.host_bytes_s or 1.0
            shard = (s.params_bytes + s.grads_bytes) / n
            offload_ms = 1e3 * (shard / host + 2 * (s.optimizer_bytes + s.params_bytes) / n / HOST_OPTIMIZER_BYTES_S)
            if offload == "params":
                offload_ms += 1e3 * micro * 2 * s.params_bytes / n / host
        compute = (micro * (fwd + bwd) + opt_ms) * sharing
        link = self._link(figures)
        bw = link["bytes_s"]
        beside = self._overlap(bool(link["overlaps"]))
        comm = exposed = 0.0
        window = {"forward": fwd * sharing, "backward": bwd * sharing}
        by_phase: dict[str, list[float]] = {}
        for c in strategy.collectives(s, n, micro):
            if self.link is None and figures is not None and c.name in figures.collectives_ms:
                ms = figures.collectives_ms[c.name]
            elif self.link is not None:
                ms = 1e3 * c.times * self.link.seconds(c.name, c.bytes_per_gpu, c.calls)
            else:
                ms = 1e3 * c.bytes_per_gpu * c.times / bw if bw else 0.0
            comm += ms
            if c.overlaps and beside > 0:
                # each time, one call has nothing to run beside: the first unit's all-gather
                # before any compute, the last bucket's or unit's reduction after it
                hideable = beside * ms * (1 - 1 / max(c.calls, 1))
                acc = by_phase.setdefault(c.overlaps, [0.0, 0.0])
                acc[0] += hideable
                acc[1] = max(acc[1], c.times * window[c.overlaps])
                exposed += ms - hideable
            else:
                exposed += ms
        for hidden, span in by_phase.values():
            exposed += max(0.0, hidden - span)
        return {"compute_ms": compute, "comm_ms": comm, "exposed_comm_ms": exposed, "offload_ms": offload_ms,
                "time_ms": compute + exposed + offload_ms}

    def _overlap(self, overlaps: bool) -> float:
        """The share of an overlapping collective that can run beside compute: on this machine's
        CPU ranks, as far as a core is free for each rank's collectives (gloo's thread); on GPUs,
        all of it where the link runs on its own streams."""
        if self.spec.name == "cpu":
            return spare_cores_per_rank(self.gpus)
        return 1.0 if overlaps else 0.0

    def _sharing(self, figures: ComputeFigures | None = None) -> float:
        """How much slower each rank computes than one process alone: ``gpus`` CPU ranks of this
        machine (target ``cpu``) at their threads share its cores; GPUs each have their own."""
        if self.spec.name != "cpu" or (figures is not None and figures.ranks == self.gpus):
            return 1.0  # each GPU its own; or the ranks' sharing measured while they stepped together
        if figures is not None:
            return rank_sharing(self.gpus, threads=figures.threads, cpu_share=figures.cpu_share)
        return rank_sharing(self.gpus)

    def _max_batch(self, strategy: BaseStrategy, checkpointing: str, offload: str, micro: int) -> int:
        """The largest per-GPU batch whose peak plus batch-size's smallest margin fits: each
        phase's peak is a line in the batch (traces at 1 and 2)."""
        memory = float(self.spec.memory_bytes or 0)
        s = self.sizes(checkpointing)
        lo, hi = self.point(checkpointing, 1), self.point(checkpointing, 2)
        one = strategy.phase_bytes(s, self.gpus, offload, lo.breakdowns, accumulating=micro > 1, moments=lo.moments)
        two = strategy.phase_bytes(s, self.gpus, offload, hi.breakdowns, accumulating=micro > 1, moments=hi.moments)
        budget = memory * (1 - MIN_MARGIN_FRACTION)
        best = 1 << 31
        for a, c in zip(one, two, strict=True):
            slope, base = c.total - a.total, 2 * a.total - c.total
            if base > budget:
                return 0
            if slope > 0:
                best = min(best, math.floor((budget - base) / slope))
        return max(0, best)


def _line(lo: _Point, hi: _Point, b: int) -> _Point:
    """The point at batch ``b`` on the per-kind lines through batches 1 and 2."""
    def at(x1: float, x2: float) -> float:
        return x1 + (x2 - x1) * (b - 1)

    def kinds_at(a: dict[str, int], c: dict[str, int]) -> dict[str, int]:
        return {k: int(max(0.0, at(a.get(k, 0), c.get(k, 0)))) for k in set(a) | set(c)}

    breakdowns = {phase: kinds_at(lo.breakdowns[phase], hi.breakdowns.get(phase, {})) for phase in lo.breakdowns}
    moments = {g: kinds_at(lo.moments[g], hi.moments[g]) for g in lo.moments if g in hi.moments}
    ms = {p: (None if lo.phase_ms[p] is None or hi.phase_ms.get(p) is None
              else max(0.0, at(float(lo.phase_ms[p] or 0), float(hi.phase_ms[p] or 0)))) for p in lo.phase_ms}
    return _Point(breakdowns, ms, int(at(lo.activations, hi.activations)), moments, lo.micro_batches)


def plan(evaluator: Evaluator, global_batch: int) -> tuple[list[ParallelPrediction], list[Rejected]]:
    """Every option that fits, by throughput, and the reason for each strategy mode with none."""
    n = evaluator.gpus
    per_gpu = global_batch // n
    batches = [b for b in range(1, per_gpu + 1) if per_gpu % b == 0 and (b & (b - 1) == 0 or b == per_gpu)]
    fitting: list[ParallelPrediction] = []
    rejected: list[Rejected] = []
    for strategy in STRATEGIES.values():
        for ckpt in CHECKPOINTING:
            for offload in strategy.offloads:
                smallest: ParallelPrediction | None = None
                found = False
                for b in batches:
                    option = evaluator.evaluate(strategy, ckpt, offload, b, per_gpu // b, exact=b <= 2)
                    if smallest is None:
                        smallest = option
                    if option.fits is not False:
                        fitting.append(option)
                        found = True
                if not found and smallest is not None:
                    rejected.append(_reason(smallest))
    fitting.sort(key=lambda o: -(o.samples_per_s or 0.0))
    if fitting and fitting[0].note:
        best = fitting[0]
        fitting[0] = evaluator.evaluate(STRATEGIES[best.strategy], best.activation_checkpointing, best.offload,
                                        best.batch_size, best.micro_batches)
        if fitting[0].fits is False:
            rejected.append({**_reason(fitting.pop(0)), "reason": "does not fit when traced at its batch"})
        fitting.sort(key=lambda o: -(o.samples_per_s or 0.0))  # the exact trace may move it down
    return fitting, rejected


def _reason(o: ParallelPrediction) -> Rejected:
    title = STRATEGIES[o.strategy].title
    return Rejected(strategy=o.strategy, activation_checkpointing=o.activation_checkpointing, offload=o.offload,
                    needs_bytes=o.peak_bytes, batch_size=o.batch_size,
                    reason=f"{title} does not fit: needs {_gb(o.peak_bytes)} per GPU at per-GPU batch {o.batch_size}")


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"
