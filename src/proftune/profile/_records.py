"""The Profile: one frozen, JSON-serialisable record of what was measured.

Every consumer (recommend, search, compress, diagnose, report) reads this record; nobody
re-measures what it already holds. ``schema_version`` changes when a field changes meaning.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from .._jsonsafe import json_dumps, json_safe
from .._paths import write_text
from .._records import record_fields, stored_version
from ..exceptions import ConfigError

__all__ = [
    "SCHEMA_VERSION",
    "Bottleneck",
    "CommProfile",
    "GradProfile",
    "LayerProfile",
    "LayerStatistics",
    "MemoryProfile",
    "ParamCounts",
    "Profile",
    "StepProfile",
    "TypeTotals",
    "UncountedOpEntry",
    "compare_profiles",
    "load_spread",
]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ParamCounts:
    total: int = 0
    trainable: int = 0


@dataclass(frozen=True)
class LayerProfile:
    """One layer (module path): its size, cost and measured time, memory and statistics."""

    name: str
    type: str
    params: int = 0
    macs: int = 0
    flops: int = 0
    forward_ms: float | None = None
    backward_ms: float | None = None
    activation_bytes: int | None = None
    gflops_per_s: float | None = None
    #: The layer's share of the step's forward+backward time: its fastest forward+backward over the
    #: layer-timed steps, of the step the pieces make at their fastest (a busy machine only adds
    #: time, and to whichever piece it stalls: the fastest is what the piece costs), else its time
    #: over the typical step's.
    time_share: float | None = None
    params_share: float | None = None
    macs_share: float | None = None
    stats: LayerStatistics = field(default_factory=lambda: LayerStatistics())
    #: Its time on each layer-timed step on the same scale: their median, quartiles (two steps or
    #: more: how far the load moved it), its second-fastest and how many steps.
    time_share_median: float | None = None
    time_share_q1: float | None = None
    time_share_q3: float | None = None
    time_share_samples: int = 0
    time_share_second: float | None = None

    @property
    def share_within_noise(self) -> bool:
        """Its share cannot be told from the load's noise: timed on fewer than two steps. The share is
        its fastest step's, which a busy machine cannot make faster; a lone fast step among stalled
        ones is the layer's cost, not noise (beside two CPU-bound processes the widest Linear of a
        small MLP had one unstalled step in 15, at 63% of the step, as quiet runs read it)."""
        return self.time_share_samples < 2 or self.time_share is None

    def share_range(self) -> str:
        """`` (fastest of 5 steps; their middle half took 1.0-1.3x as long)``: its share's footing, led
        by ``within noise:`` where it was timed on one step; ``""`` untimed."""
        noise = "within noise: " if self.share_within_noise else ""
        n = self.time_share_samples
        spread = load_spread(self.time_share, self.time_share_q1, self.time_share_q3)
        if not spread:
            return f" ({noise}timed on {n} step{'s' if n != 1 else ''})" if n else ""
        return f" ({noise}fastest of {n} steps; their middle half took {spread} as long)"


def load_spread(fastest: float | None, q1: float | None, q3: float | None) -> str:
    """``1.0-1.3x``: the middle half of a layer's steps against its fastest (how far the machine's
    load moved it); ``""`` where it was timed on fewer than two steps."""
    if not fastest or q1 is None or q3 is None:
        return ""
    return f"{q1 / fastest:.1f}-{q3 / fastest:.1f}x"


@dataclass(frozen=True)
class MemoryProfile:
    """Bytes: parameters, gradients, optimizer state, activations saved for backward, step peak."""

    params_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    activations_bytes: int = 0
    peak_bytes: int = 0


@dataclass(frozen=True)
class StepProfile:
    """Milliseconds of one training (or inference) step and its phases; throughput in samples/s."""

    time_ms: float = 0.0
    data_ms: float = 0.0
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    optimizer_ms: float = 0.0
    other_ms: float = 0.0
    throughput: float = 0.0
    #: Of forward+backward, the milliseconds no layer accounts for (the task's loss, work done
    #: outside any module); measured on the layer-timed steps, 0 when layers were not timed.
    outside_layers_ms: float = 0.0
    #: The fastest measured step (ms), the spread of the steps (median / fastest - 1: 0.05 is
    #: a quiet machine, 1.0 a step that took twice as long as it can), and the process's CPU time
    #: per step (median and fastest, ms; at one thread, the step's own cost, which other
    #: processes can delay but not increase).
    min_ms: float = 0.0
    noise: float = 0.0
    cpu_ms: float = 0.0
    cpu_min_ms: float = 0.0


@dataclass(frozen=True)
class GradProfile:
    """Global gradient norm, its variance across sampled steps, and the update-to-weight ratio."""

    norm: float | None = None
    var: float | None = None
    update_ratio: float | None = None


@dataclass(frozen=True)
class CommProfile:
    """Distributed communication per step: bytes all-reduced, time spent, share of the step."""

    backend: str = ""
    world_size: int = 1
    allreduce_bytes: int = 0
    allreduce_ms: float = 0.0
    allreduce_calls: int = 0
    share: float = 0.0


class _Bottleneck(TypedDict):
    name: str
    type: str
    time_share: float
    params_share: float | None
    macs_share: float | None
    #: time share / the larger of the params and MACs shares (>1: slower than its size).
    excess: float | None
    finding: str


class Bottleneck(_Bottleneck, total=False):
    """One of the layers that take most of the step (``Profile.bottlenecks``); a profile recorded
    before a share's spread over the steps was kept has no quartiles, samples or ``within_noise``."""

    time_share_q1: float | None
    time_share_q3: float | None
    time_share_samples: int
    within_noise: bool


class TypeTotals(TypedDict):
    """The layers of one type added up (``Profile.by_type``); an untimed layer adds no time."""

    type: str
    count: int
    params: int
    macs: int
    flops: int
    forward_ms: float
    backward_ms: float
    time_share: float
    activation_bytes: int


class LayerStatistics(TypedDict, total=False):
    """One layer's statistics of a sampled step (:meth:`LayerStats.collect`): its type and calls,
    and of the kinds gathered for it, ``weight`` (l2, mean, std, p1, p50, p99, numel, nonfinite),
    ``activation`` (mean, std, min, max, p1, p50, p99, zero_frac, nonfinite, dead_frac) and
    ``grad`` (norm, nonfinite, update_ratio; None: not known)."""

    type: str
    calls: int
    weight: dict[str, float]
    activation: dict[str, float]
    grad: dict[str, float | None]


class UncountedOpEntry(TypedDict):
    """An op the FLOP count could not count (``Profile.uncounted_ops``): its name, calls and up to
    5 distinct input shapes."""

    op: str
    calls: int
    shapes: list[list[list[int]]]


@dataclass(frozen=True)
class Profile:
    """What was measured of a model and its training step; see DESIGN.md for units."""

    task: str | None = None
    device: str = "cpu"
    batch_size: int = 0
    mode: str = "train"
    steps: int = 0
    params: ParamCounts = field(default_factory=ParamCounts)
    macs: int = 0
    flops: int = 0
    backward_flops: int = 0
    layers: tuple[LayerProfile, ...] = ()
    memory: MemoryProfile = field(default_factory=MemoryProfile)
    step: StepProfile = field(default_factory=StepProfile)
    grad: GradProfile = field(default_factory=GradProfile)
    comm: CommProfile | None = None
    bottlenecks: tuple[Bottleneck, ...] = ()
    by_type: tuple[TypeTotals, ...] = ()
    env: Mapping[str, object] = field(default_factory=dict)
    config: Mapping[str, object] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    #: Ops that do arithmetic the FLOP count could not count (custom ops, no formula); empty when
    #: all were counted.
    uncounted_ops: tuple[UncountedOpEntry, ...] = ()
    #: The module tree (``profile --structure``): :meth:`Structure.to_dict` of the model for the
    #: profiled input; None where it was not asked for.
    structure: Mapping[str, object] | None = None

    # -- derived ----------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Profile metrics usable in constraints and objectives (DESIGN.md names)."""
        out: dict[str, float] = {
            "step_time_ms": float(self.step.time_ms),
            "peak_memory_bytes": float(self.memory.peak_bytes),
            "throughput": float(self.step.throughput),
            "params": float(self.params.total),
            "macs": float(self.macs),
            "flops": float(self.flops),
        }
        if self.config.get("detail") == "time":  # counts and memory were not measured
            for key in ("params", "macs", "flops"):
                del out[key]
            if not self.memory.peak_bytes:
                del out["peak_memory_bytes"]
        if self.grad.var is not None:
            out["grad_var"] = float(self.grad.var)
        if self.grad.norm is not None:
            out["grad_norm"] = float(self.grad.norm)
        return out

    def layer(self, name: str) -> LayerProfile:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"no layer {name!r} in this profile; layers: {[lay.name for lay in self.layers][:20]}")

    # -- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        return dict(json_safe(d))

    def to_json(self, *, indent: int | None = 2) -> str:
        return json_dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Profile:
        """The profile back from :meth:`to_dict`'s JSON (a ``profile`` Run's result, a saved file);
        a key that is no field of it, at any level, is a :class:`ConfigError` naming it."""
        stored_version(d, what="a profile", current=SCHEMA_VERSION)
        kw = record_fields(cls, d, what="a profile")
        _check_shape(d)
        kw.update({key: _build(part, d.get(key) or {}) for key, part in
                   (("params", ParamCounts), ("memory", MemoryProfile), ("step", StepProfile), ("grad", GradProfile))})
        kw["comm"] = _build(CommProfile, d["comm"]) if d.get("comm") else None
        kw["layers"] = tuple(_build(LayerProfile, lay) for lay in d.get("layers") or [])
        kw["bottlenecks"] = tuple(d.get("bottlenecks") or ())
        kw["by_type"] = tuple(d.get("by_type") or ())
        kw["uncounted_ops"] = tuple(d.get("uncounted_ops") or ())
        return cls(**kw)

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON; returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        return write_text(p, self.to_json())  # atomic: a crash never leaves half a file

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"profile file {str(p)!r} does not exist.")
        try:
            data = json.loads(p.read_text())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"profile file {str(p)!r} is not JSON: {exc}") from exc
        return cls.from_dict(data)


#: What a profile's JSON must hold, for the one message that names it.
_PROFILE_SHAPE = ("a profile is a JSON object holding 'task' (a string), 'params' (an object) and 'layers' "
                  "(a list of layer objects), as `proftune profile TASK --out FILE.json` writes it")


def _check_shape(d: Mapping[str, Any]) -> None:
    """A JSON object that is no profile (``{}``, ``{"layers": "x"}``): one :class:`ConfigError`."""
    missing = [k for k in ("task", "params", "layers") if k not in d]
    if missing:
        raise ConfigError(f"this JSON is not a profile: it has no {', '.join(map(repr, missing))}; "
                          f"{_PROFILE_SHAPE}.")
    wrong = [f"{k!r} is {type(d[k]).__name__}" for k, kind in
             (("task", str), ("params", dict), ("layers", list), ("memory", dict), ("step", dict),
              ("grad", dict), ("bottlenecks", list), ("by_type", list), ("uncounted_ops", list))
             if d.get(k) is not None and not isinstance(d[k], kind)]
    wrong += [f"'layers' item {i} is {type(x).__name__}" for i, x in enumerate(d["layers"] or [])
              if isinstance(d["layers"], list) and not isinstance(x, dict)][:1]
    if d.get("comm") is not None and not isinstance(d["comm"], dict):
        wrong.append(f"'comm' is {type(d['comm']).__name__}")
    if wrong:
        raise ConfigError(f"this JSON is not a profile: {'; '.join(wrong)}; {_PROFILE_SHAPE}.")


def _build(cls: type, d: Mapping[str, Any]) -> Any:
    return cls(**record_fields(cls, d, what=f"a profile's {cls.__name__}"))


def compare_profiles(a: Profile, b: Profile) -> dict[str, object]:
    """Per-layer and total differences from ``a`` to ``b`` (before and after pruning, say)."""

    def delta(x: float | None, y: float | None) -> dict[str, float | None]:
        ratio = (y / x) if (x and y is not None) else None
        diff = (y - x) if (x is not None and y is not None) else None
        return {"a": x, "b": y, "delta": diff, "ratio": ratio}

    totals = {
        "params": delta(a.params.total, b.params.total),
        "macs": delta(a.macs, b.macs),
        "flops": delta(a.flops, b.flops),
        "step_time_ms": delta(a.step.time_ms, b.step.time_ms),
        "peak_bytes": delta(a.memory.peak_bytes, b.memory.peak_bytes),
        "throughput": delta(a.step.throughput, b.step.throughput),
    }
    la = {lay.name: lay for lay in a.layers}
    lb = {lay.name: lay for lay in b.layers}
    layers = []
    for name in list(la) + [n for n in lb if n not in la]:
        x, y = la.get(name), lb.get(name)
        layers.append({
            "name": name,
            "type": (x or y).type,  # type: ignore[union-attr]
            "status": "both" if x and y else ("only_a" if x else "only_b"),
            **{key: delta(getattr(x, key) if x else None, getattr(y, key) if y else None)
               for key in ("params", "macs", "forward_ms", "backward_ms")},
        })
    return {"totals": totals, "layers": layers}
