"""Per-layer forward and backward time over the timed steps (each layer's median: one step that the
machine's load stalls does not move it), each layer's share of each timed step (its median and
quartiles), and the summary of a step's phases (the median step's own, adding up to it).

Both passes are cut at the moments layers start, and each piece goes to the layer that started
it, so the layers' times add up to the pass (synchronised on CUDA). Forward: a layer's piece
runs from its forward pre-hook to the next layer's (the last one to the end of the model's
forward); the work a container does between its children (a residual add) lands on the layer
before it. Backward: autograd runs layers in reverse; a hook on the autograd node that produced
each layer's output fires when that layer's backward starts; the last piece ends when backward
ends (``mark_backward_end``). What runs outside the model (the loss) is not any layer's. No full
backward hooks are used: they break on layers followed by an in-place op (torchvision's
``ReLU(inplace=True)``).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from .._device import clock
from ._layers import LayerHooks, output_tensors

__all__ = ["PHASES", "SHARES_KEPT", "LayerTimer", "ShareSpread", "fastest_step_ms", "median", "scaled_to",
           "share_spread", "step_summary"]

#: Per layer, the shares of this many latest sampled steps are kept (a Monitor over a long run
#: samples thousands of steps; the spread of the latest few hundred is what the load does now).
SHARES_KEPT = 256


class LayerTimer:
    """Times every layer call of the steps it is attached to; one :meth:`end_step` per step."""

    def __init__(self, model: nn.Module, device: torch.device | None = None, *,
                 hooks: LayerHooks | None = None) -> None:
        self.device = device
        self._sync = device is not None and device.type == "cuda"
        if hooks is None:
            hooks = LayerHooks(model, sync=self._sync, device=device)
        hooks.listeners.append(self._on_leaf)
        hooks.forward_start_listeners.append(self._on_forward_start)
        hooks.forward_end_listeners.append(self._on_forward_end)
        self._hooks = hooks
        self._active = False  # the hooks may be shared: listen only while attached
        self.types: dict[str, str] = {}
        self._fwd: dict[str, float] = {}
        self._events: list[tuple[float, str]] = []
        self._nodes: set[int] = set()
        self._bwd_end: float | None = None
        #: One ``(forward_ms, backward_ms)`` dict pair per finished step (since the last :meth:`fold`).
        self.steps: list[tuple[dict[str, float], dict[str, float]]] = []
        # per layer, its forward ms and (where it has a backward) backward ms of each finished step,
        # the latest SHARES_KEPT: what :meth:`per_layer` takes the medians of
        self._fwd_ms: dict[str, deque[float]] = {}
        self._bwd_ms: dict[str, deque[float]] = {}
        # of each step given its forward+backward time: that time, and the share of it that no
        # layer's piece covers
        self._totals: deque[float] = deque(maxlen=SHARES_KEPT)
        self._outside_shares: deque[float] = deque(maxlen=SHARES_KEPT)
        #: Per layer, its forward+backward ms of each step given its total (the latest
        #: :data:`SHARES_KEPT`), and what no layer covered of each such step: from these a profile
        #: takes each layer's share at its fastest, and the spread the load gave it.
        self.step_ms: dict[str, deque[float]] = {}
        self.rest_ms: deque[float] = deque(maxlen=SHARES_KEPT)

    @property
    def attached(self) -> bool:
        return self._active and self._hooks.attached

    def attach(self) -> LayerTimer:
        self._hooks.attach()
        self._active = True
        self._begin()
        return self

    def detach(self) -> None:
        self._active = False
        self._hooks.detach()

    def _begin(self) -> None:
        # the graph outlives the step while the user holds its loss: take the hooks off it, so
        # that their closures (thousands on a deep model) go now, not at the next collection
        for h in getattr(self, "_node_hooks", ()):
            h.remove()
        self._node_hooks: list[Any] = []
        self._fwd = {}
        self._starts: list[tuple[float, str]] = []
        self._forward_begins: list[float] = []
        self._events = []
        self._nodes = set()
        self._bwd_end = None

    def _now(self) -> float:
        return clock(self.device) if self._sync else time.perf_counter()

    def _on_leaf(self, name: str, mod: nn.Module, inputs: tuple[Any, ...], output: Any,
                 start: float, end: float) -> None:
        if not self._active:
            return
        if name not in self.types:
            self.types[name] = type(mod).__name__
        self._starts.append((start, name))
        if not torch.is_grad_enabled():
            return
        for t in output_tensors(output):
            node = t.grad_fn
            if node is None or id(node) in self._nodes:
                continue
            self._nodes.add(id(node))
            self._node_hooks.append(node.register_prehook(self._backward_starts(name)))

    def _on_forward_start(self, start: float) -> None:
        if self._active:
            self._forward_begins.append(start)

    def _on_forward_end(self, end: float) -> None:
        if not self._active:
            return
        starts = sorted(self._starts)
        for i, (t, name) in enumerate(starts):
            nxt = starts[i + 1][0] if i + 1 < len(starts) else end
            self._fwd[name] = self._fwd.get(name, 0.0) + max(nxt - t, 0.0) * 1e3
        self._starts = []

    def _backward_starts(self, name: str) -> Any:
        def hook(grad_outputs: Any) -> None:
            self._events.append((self._now(), name))

        return hook

    def mark_backward_end(self, when: float | None = None) -> None:
        """The backward pass ended now (or at ``when``, ``time.perf_counter`` seconds)."""
        self._bwd_end = when if when is not None else self._now()

    def end_step(self, total_ms: float | None = None) -> tuple[dict[str, float], dict[str, float]]:
        """Close the step: per-layer forward and backward milliseconds; starts the next step.

        ``total_ms``: the step's forward+backward time, which each layer's share of this step is
        taken of (kept in :attr:`shares`); without it, no share is kept for this step."""
        bwd: dict[str, float] = {}
        events = sorted(self._events)
        begins = sorted(self._forward_begins)
        for i, (t, name) in enumerate(events):
            nxt = events[i + 1][0] if i + 1 < len(events) else self._bwd_end
            # with gradient accumulation the next micro-batch's forward starts before the next
            # backward event: a piece never runs past it
            later = [b for b in begins if b > t]
            if later and (nxt is None or later[0] < nxt):
                nxt = later[0]
            if nxt is None:
                continue
            bwd[name] = bwd.get(name, 0.0) + max(nxt - t, 0.0) * 1e3
        result = (dict(self._fwd), bwd)
        for name in dict.fromkeys([*self._fwd, *bwd]):
            _keep(self._fwd_ms, name, self._fwd.get(name, 0.0))
            if name in bwd or name in self._bwd_ms:
                _keep(self._bwd_ms, name, bwd.get(name, 0.0))
            if total_ms is not None and total_ms > 0:
                _keep(self.step_ms, name, self._fwd.get(name, 0.0) + bwd.get(name, 0.0))
        if total_ms is not None and total_ms > 0:
            covered = sum(self._fwd.values()) + sum(bwd.values())
            self._totals.append(total_ms)
            self._outside_shares.append(1 - covered / total_ms)
            self.rest_ms.append(max(total_ms - covered, 0.0))
        self.steps.append(result)
        self._begin()
        return result

    def fold(self) -> None:
        """Drop the finished steps' dicts: a Monitor over a long run keeps the latest
        :data:`SHARES_KEPT` numbers per layer, not one dict per sampled step (memory, and objects the
        garbage collector walks)."""
        self.steps = []

    def per_layer(self) -> dict[str, tuple[float, float | None]]:
        """Each layer's median ``(forward_ms, backward_ms)`` over the finished steps (the latest
        :data:`SHARES_KEPT`).

        The median, not the mean: a step that the machine's load stalls inside one layer moves
        that layer's mean (a ReLU read 63% of the step in one run and 20% in the next), not its
        median; the profile compares it with the median step."""
        return {name: (median(fwd), median(self._bwd_ms[name]) if name in self._bwd_ms else None)
                for name, fwd in self._fwd_ms.items()}

    def typical_step_ms(self) -> tuple[float, float]:
        """``(forward+backward ms, of which outside any layer)`` of the typical step: the layers'
        medians, and what no layer covers (the loss) at the median of its shares of each step, as
        a layer's share is taken; the layers' times and the rest add up to it, and a step stalled
        in one layer or in the rest moves none of them. (0, 0) before any step was given its
        forward+backward time."""
        if not self._totals:
            return 0.0, 0.0
        rest = max(median(self._outside_shares), 0.0)
        layers = sum(f + (b or 0.0) for f, b in self.per_layer().values())
        if rest >= 1 or layers <= 0:  # no layer's piece in the typical step: all of it is the rest
            return median(self._totals), median(self._totals)
        total = layers / (1 - rest)
        return total, total - layers


def _keep(kept: dict[str, deque[float]], name: str, value: float) -> None:
    kept.setdefault(name, deque(maxlen=SHARES_KEPT)).append(value)


def median(values: Sequence[float]) -> float:
    vals = [float(v) for v in values]
    return float(statistics.median(vals)) if vals else 0.0


class ShareSpread(NamedTuple):
    """One layer's share of the step: at its fastest, and the quartiles and median of its per-step
    times on the same scale (two steps or more), its second-fastest, and how many steps."""

    median: float | None
    q1: float | None
    q3: float | None
    samples: int
    fastest: float | None = None
    second: float | None = None


def fastest_step_ms(step_ms: Mapping[str, Sequence[float]], rest_ms: Sequence[float]) -> float:
    """The step the layers make at their fastest: each layer's fastest time over the timed steps,
    and the fastest of what no layer covered. A busy machine only ever adds time to a piece (the
    process waits while another runs), so the fastest is what the piece costs; its median moves
    with the load (beside two CPU-bound processes on two cores the widest Linear of a small MLP
    read 84% of the step by medians and 68% at its fastest, 67-69% quiet)."""
    layers = sum(min(v) for v in step_ms.values() if v)
    return layers + (min(rest_ms) if rest_ms else 0.0)


def share_spread(times_ms: Sequence[float], step_ms: float) -> ShareSpread:
    """One layer's per-step times as shares of ``step_ms`` (:func:`fastest_step_ms`): its fastest,
    second-fastest, median and quartiles; the quartiles need two steps."""
    vals = sorted(float(v) for v in times_ms)
    if not vals or step_ms <= 0:
        return ShareSpread(None, None, None, 0)
    shares = [v / step_ms for v in vals]
    q1 = q3 = None
    if len(shares) >= 2:
        q1, _, q3 = statistics.quantiles(shares, n=4, method="inclusive")
    return ShareSpread(float(statistics.median(shares)), q1, q3, len(shares), shares[0],
                       shares[1] if len(shares) >= 2 else None)


PHASES = ("data_ms", "forward_ms", "backward_ms", "optimizer_ms")


def step_summary(timings: Sequence[dict[str, float]], samples: Sequence[int]) -> dict[str, float]:
    """The median step's time and phases, and the throughput (samples/s) of the median step.

    Each timing holds ``data_ms``, ``forward_ms``, ``backward_ms``, ``optimizer_ms``, ``wall_ms``
    (the whole step, end to end) and ``cpu_ms`` (the process's CPU time in it). The phases are
    the median step's own (the mean of the two middle steps' for an even count), so that they add
    up to its time: medians taken phase by phase add up to more than the median step when the
    steps differ. ``other_ms`` is the wall time no phase explains; a step whose phases add up to
    more than its wall (clocks read apart) takes their sum as its time. Beside the median: the
    fastest step (``min_ms``), the spread (``noise`` = median / fastest - 1) and the CPU time
    (``cpu_ms``, ``cpu_min_ms``).
    """
    if not timings:
        return {"time_ms": 0.0, "data_ms": 0.0, "forward_ms": 0.0, "backward_ms": 0.0,
                "optimizer_ms": 0.0, "other_ms": 0.0, "throughput": 0.0, "min_ms": 0.0,
                "cpu_ms": 0.0, "cpu_min_ms": 0.0, "noise": 0.0}
    steps = []
    for t in timings:
        phases = {k: float(t.get(k, 0.0)) for k in PHASES}
        wall = max(float(t.get("wall_ms", 0.0)), sum(phases.values()))
        steps.append({**phases, "wall_ms": wall})
    steps.sort(key=lambda t: t["wall_ms"])
    n = len(steps)
    middle = steps[(n - 1) // 2: n // 2 + 1]  # one step for an odd count, the two middle ones else
    out = {k: statistics.fmean(t[k] for t in middle) for k in PHASES}
    wall = statistics.fmean(t["wall_ms"] for t in middle)
    out["time_ms"] = wall
    out["other_ms"] = max(wall - sum(out[k] for k in PHASES), 0.0)
    # the spread of the steps, and the CPU time beside the wall time: how much the machine's load
    # (or anything else) moved the measurement
    out["min_ms"] = steps[0]["wall_ms"]
    out["noise"] = wall / out["min_ms"] - 1 if out["min_ms"] > 0 else 0.0
    cpus = [t["cpu_ms"] for t in timings if "cpu_ms" in t]
    out["cpu_ms"] = median(cpus) if cpus else 0.0
    out["cpu_min_ms"] = min(cpus) if cpus else 0.0
    count = median([float(s) for s in samples]) if samples else 0.0
    out["throughput"] = count / (wall / 1e3) if wall > 0 else 0.0
    return out


def scaled_to(summary: dict[str, float], wall_ms: float) -> dict[str, float]:
    """``summary`` (of instrumented steps) with its phases as shares of its step applied to a step
    of ``wall_ms`` (an untouched one, measured without the hooks' cost): the phases and
    ``other_ms`` still add up to the step. Keeps the instrumented step's time as ``sampled_ms``."""
    out = dict(summary)
    sampled = summary["time_ms"]
    scale = wall_ms / sampled if sampled > 0 else 0.0
    for k in (*PHASES, "other_ms"):
        out[k] = summary[k] * scale
    if sampled <= 0:
        out["other_ms"] = wall_ms
    out["sampled_ms"] = sampled
    out["time_ms"] = wall_ms
    return out
