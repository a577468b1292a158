"""Turn the measurements of sampled steps into one :class:`Profile` (for profile() and Monitor)."""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from ._records import (
    Bottleneck,
    CommProfile,
    GradProfile,
    LayerProfile,
    LayerStatistics,
    MemoryProfile,
    ParamCounts,
    Profile,
    StepProfile,
    TypeTotals,
)
from ._static import StaticCounts, count_model
from ._timing import LayerTimer, fastest_step_ms, share_spread

__all__ = ["Measurements", "StatsMerge", "assemble_profile", "merge_layer_stats", "static_counts"]


@dataclass
class Measurements:
    """What the profiling callbacks and the Monitor gather; every time in ms, memory in bytes."""

    #: Per layer: median (forward_ms, backward_ms or None) over the layer-timed steps.
    layer_times: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    layer_types: dict[str, str] = field(default_factory=dict)
    #: Forward+backward ms of the typical layer-timed step: the layers' medians and what no layer
    #: covers at the median of its per-step shares (what the layer times add up to, with the rest).
    timed_fwd_bwd_ms: float = 0.0
    #: Per layer, its forward+backward ms of each layer-timed step, and what no layer covered of
    #: each such step, oldest first.
    layer_step_ms: dict[str, list[float]] = field(default_factory=dict)
    rest_step_ms: list[float] = field(default_factory=list)
    step: dict[str, float] = field(default_factory=dict)
    params_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    activations_bytes: int = 0
    activation_per_layer: dict[str, int] | None = None
    peak_bytes: int = 0
    #: Per layer statistics of each sampled step (LayerStats.collect()), oldest first.
    stats: list[dict[str, LayerStatistics]] = field(default_factory=list)
    #: Or those statistics already merged (a Monitor merges them as they come).
    merged_stats: StatsMerge | None = None
    grad_norms: list[float] = field(default_factory=list)
    update_ratios: list[float] = field(default_factory=list)
    comm: CommProfile | None = None

    def take_layers(self, timer: LayerTimer) -> None:
        """The layer timer's medians, its typical step and per-step shares."""
        self.layer_times = timer.per_layer()
        self.layer_types = dict(timer.types)
        self.timed_fwd_bwd_ms = timer.typical_step_ms()[0]
        self.layer_step_ms = {name: list(v) for name, v in timer.step_ms.items()}
        self.rest_step_ms = list(timer.rest_ms)


def static_counts(model: nn.Module, example_input: Any, *, backward: bool,
                  copy_model: bool = False, train: bool = True) -> StaticCounts:
    """:func:`count_model` without side effects on the model: counted in training mode, or in
    eval mode with ``train=False`` (an inference profile: BatchNorm at batch 1 only runs in eval
    mode; the counter also sees the fused attention fast paths, so the MACs are the same),
    buffers (BatchNorm statistics) restored afterwards, the global RNG state untouched;
    ``copy_model`` counts backward on a copy so the model's gradients survive."""
    target = model
    if backward and copy_model:
        try:
            target = copy.deepcopy(model)
        except Exception:  # noqa: BLE001 - some wrapped models cannot be copied; count forward only then
            target, backward = model, False
    was_training = target.training
    devices = [d.index or 0 for d in {p.device for p in target.parameters()} if d.type == "cuda"]
    saved = {name: b.detach().clone() for name, b in target.named_buffers()}
    target.train(train)
    try:
        with torch.random.fork_rng(devices=devices):
            return count_model(target, example_input, backward=backward)
    finally:
        target.train(was_training)
        with torch.no_grad():
            for name, b in target.named_buffers():
                if name in saved:
                    b.copy_(saved[name])


#: Reads one kind of one layer's statistics when asked: ``fetch(layer, kind)``.
Fetch = Callable[[str, str], "dict[str, float] | None"]


class StatsMerge:
    """Per-layer statistics of successive samples merged as they come: per layer, the latest
    sample's statistics of each kind (``weight``, ``activation``, ``grad``: a rotating Monitor
    covers a deep model's layers over several samples), and the running mean and variance of the
    gradient norm across all samples (``grad.norm_mean``, ``grad.norm_var``, ``grad.samples``).
    Constant memory over a long run: nothing of an older sample is kept but those three numbers.

    :meth:`add_deferred` takes a sample whose ``weight`` and ``activation`` statistics are
    fetched only when :meth:`result` needs them (a sample that no layer's latest statistics
    come from any more is then dropped unread).
    """

    def __init__(self) -> None:
        self._order: dict[str, None] = {}
        self._latest: dict[str, dict[str, object]] = {}  # kinds as LayerStatistics holds them
        self._deferred: dict[str, dict[str, Fetch]] = {}  # layer -> kind -> where to read it
        self._norms: dict[str, tuple[int, float, float]] = {}  # layer -> (count, mean, M2) (Welford)

    def add(self, sample: Mapping[str, LayerStatistics]) -> None:
        """A sample's statistics per layer (dicts of kinds, plus ``type`` and ``calls``)."""
        self.add_deferred(sample, {}, lambda layer, kind: None)  # no kinds deferred: never called

    def add_deferred(self, entries: Mapping[str, LayerStatistics], kinds: dict[str, list[str]], fetch: Fetch) -> None:
        """A sample's ``entries`` per layer (read now), and per layer the ``kinds`` that
        ``fetch(layer, kind)`` reads when needed."""
        # the latest sample's order first, then any layer seen only before
        self._order = {**dict.fromkeys(entries), **self._order} if self._order else dict.fromkeys(entries)
        for name, stats in entries.items():
            latest = self._latest.setdefault(name, {})
            latest.update(stats)  # each kind it holds replaces the older one; the others stay
            for kind in stats:
                self._deferred.get(name, {}).pop(kind, None)
            norm = (stats.get("grad") or {}).get("norm")
            if norm is not None:
                n, mean, m2 = self._norms.get(name, (0, 0.0, 0.0))
                n += 1
                delta = norm - mean
                mean += delta / n
                self._norms[name] = (n, mean, m2 + delta * (norm - mean))
        for name, names in kinds.items():
            for kind in names:
                self._latest.get(name, {}).pop(kind, None)
                self._deferred.setdefault(name, {})[kind] = fetch

    def result(self) -> dict[str, LayerStatistics]:
        out: dict[str, LayerStatistics] = {}
        for name in self._order:
            latest = self._latest.get(name, {})
            for kind, fetch in self._deferred.pop(name, {}).items():  # read once, kept as read
                got = fetch(name, kind)
                if got is not None:
                    latest[kind] = got
            entry = {key: copy.deepcopy(latest[key]) for key in _ORDER if key in latest}
            entry.update({key: copy.deepcopy(v) for key, v in latest.items() if key not in entry})
            grad = entry.get("grad")
            if isinstance(grad, dict) and name in self._norms:
                n, mean, m2 = self._norms[name]
                grad.update(norm_mean=mean, norm_var=m2 / n if n > 1 else None, samples=n)
            out[name] = cast(LayerStatistics, entry)
        return out


#: The order of a layer's statistics in a profile.
_ORDER = ("type", "calls", "weight", "activation", "grad")


def merge_layer_stats(samples: Sequence[Mapping[str, LayerStatistics]]) -> dict[str, LayerStatistics]:
    """The statistics of ``samples`` (oldest first) merged as :class:`StatsMerge` does."""
    merged = StatsMerge()
    for sample in samples:
        merged.add(sample)
    return merged.result()


def _share(x: float | None, total: float) -> float | None:
    if x is None or total <= 0:
        return None
    return x / total


def assemble_profile(
    m: Measurements,
    counts: StaticCounts | None,
    *,
    task: str | None,
    device: torch.device | str,
    batch_size: int,
    mode: str,
    steps: int,
    env: Mapping[str, object] | None = None,
    config: Mapping[str, object] | None = None,
) -> Profile:
    """One :class:`Profile` from static counts and measurements."""
    stats = m.merged_stats.result() if m.merged_stats is not None else merge_layer_stats(m.stats)
    count_layers = counts.layers if counts is not None else {}
    names = list(count_layers) + [n for n in m.layer_times if n not in count_layers]
    total_params = counts.params_total if counts is not None else 0
    total_macs = counts.macs if counts is not None else 0
    denom = m.timed_fwd_bwd_ms or sum(f + (b or 0.0) for f, b in m.layer_times.values())
    fastest_ms = fastest_step_ms(m.layer_step_ms, m.rest_step_ms)
    layers: list[LayerProfile] = []
    for name in names:
        c = count_layers.get(name)
        fwd, bwd = m.layer_times.get(name, (None, None))
        flops = c.flops if c is not None else 0
        gflops = flops / (fwd / 1e3) / 1e9 if (fwd and flops) else None
        t = None if fwd is None else fwd + (bwd or 0.0)
        spread = share_spread(m.layer_step_ms.get(name, ()) if fwd is not None else (), fastest_ms)
        act = None
        if m.activation_per_layer is not None:
            act = int(m.activation_per_layer.get(name, 0))
        layers.append(LayerProfile(
            name=name,
            type=c.type if c is not None else m.layer_types.get(name, "?"),
            params=c.params if c is not None else 0,
            macs=c.macs if c is not None else 0,
            flops=flops,
            forward_ms=fwd,
            backward_ms=bwd,
            activation_bytes=act,
            gflops_per_s=gflops,
            time_share=spread.fastest if spread.fastest is not None else _share(t, denom),
            params_share=_share(c.params if c is not None else 0, total_params),
            macs_share=_share(c.macs if c is not None else 0, total_macs),
            stats=stats.get(name, {}),
            time_share_median=spread.median,
            time_share_q1=spread.q1,
            time_share_q3=spread.q3,
            time_share_second=spread.second,
            time_share_samples=spread.samples,
        ))
    grad = GradProfile(
        norm=statistics.fmean(m.grad_norms) if m.grad_norms else None,
        var=statistics.pvariance(m.grad_norms) if len(m.grad_norms) > 1 else None,
        update_ratio=statistics.fmean(m.update_ratios) if m.update_ratios else None,
    )
    layer_sum = sum(f + (b or 0.0) for f, b in m.layer_times.values())
    outside = max(m.timed_fwd_bwd_ms - layer_sum, 0.0) if m.layer_times else 0.0
    step = StepProfile(**{k: float(m.step.get(k, 0.0)) for k in
                          ("time_ms", "data_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms",
                           "throughput", "min_ms", "noise", "cpu_ms", "cpu_min_ms")}, outside_layers_ms=outside)
    return Profile(
        task=task,
        device=str(device),
        batch_size=int(batch_size),
        mode=mode,
        steps=int(steps),
        params=ParamCounts(total=total_params, trainable=counts.params_trainable if counts is not None else 0),
        macs=total_macs,
        flops=counts.flops if counts is not None else 0,
        backward_flops=counts.backward_flops if counts is not None else 0,
        layers=tuple(layers),
        memory=MemoryProfile(params_bytes=m.params_bytes, grads_bytes=m.grads_bytes,
                             optimizer_bytes=m.optimizer_bytes, activations_bytes=m.activations_bytes,
                             peak_bytes=m.peak_bytes),
        step=step,
        grad=grad,
        comm=m.comm,
        bottlenecks=tuple(bottlenecks(layers)),
        by_type=tuple(_by_type(layers)),
        env=dict(env or {}),
        config=dict(config or {}),
        uncounted_ops=tuple(counts.uncounted_ops) if counts is not None else (),
    )


def bottlenecks(layers: Sequence[LayerProfile], *, top: int = 5) -> list[Bottleneck]:
    """Layers ranked by share of the step's forward+backward time, beside their share of the
    parameters and MACs; ``excess`` = time share / the larger of the two (>1: slower than its size).
    Each finding gives the share at its fastest layer-timed step and the middle half of its steps
    on that scale where there were two steps or more, and says "within noise" where its fastest step
    is alone (or it was timed on one step): a share the machine's load may have made says so."""
    timed = [lay for lay in layers if lay.time_share is not None]
    timed.sort(key=lambda lay: lay.time_share or 0.0, reverse=True)
    out: list[Bottleneck] = []
    for lay in timed[:top]:
        ts = lay.time_share or 0.0
        size = max(lay.params_share or 0.0, lay.macs_share or 0.0)
        out.append({
            "name": lay.name,
            "type": lay.type,
            "time_share": ts,
            "params_share": lay.params_share,
            "macs_share": lay.macs_share,
            "excess": ts / size if size > 0 else (math.inf if ts > 0 else None),
            "time_share_q1": lay.time_share_q1,
            "time_share_q3": lay.time_share_q3,
            "time_share_samples": lay.time_share_samples,
            "within_noise": lay.share_within_noise,
            "finding": (f"{lay.name or '(model)'} ({lay.type}) takes {ts:.0%} of forward+backward time"
                        f"{lay.share_range()} for {lay.params_share or 0:.0%} of the parameters and "
                        f"{lay.macs_share or 0:.0%} of the MACs"),
        })
    return out


def _by_type(layers: Sequence[LayerProfile]) -> list[TypeTotals]:
    agg: dict[str, TypeTotals] = {}
    for lay in layers:
        a = agg.setdefault(lay.type, TypeTotals(type=lay.type, count=0, params=0, macs=0, flops=0, forward_ms=0.0,
                                                backward_ms=0.0, time_share=0.0, activation_bytes=0))
        a["count"] += 1
        a["params"] += lay.params
        a["macs"] += lay.macs
        a["flops"] += lay.flops
        a["forward_ms"] += lay.forward_ms or 0  # an untimed layer adds nothing
        a["backward_ms"] += lay.backward_ms or 0
        a["time_share"] += lay.time_share or 0
        a["activation_bytes"] += lay.activation_bytes or 0
    return sorted(agg.values(), key=lambda a: a["time_share"], reverse=True)

