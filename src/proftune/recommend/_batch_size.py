"""The largest batch size under a memory budget, from a linear memory model of the step.

The peak of a training step is a + b·B: parameters, gradients, optimizer state and workspace
(a) plus activations and their gradients, which grow with the batch (b per sample). We fit it
from at most three short probe steps (the profile's own measurement counts as one and is not
repeated), take the safety margin from the fit's measured residual, predict the largest B
under the budget and verify it with one step at that size. A probe that runs out of memory
(``torch.OutOfMemoryError``) or measures a peak above the budget is information: an upper
bound, and (when measured) a point of the fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .._records import JsonRecord, record_fields, stored_version
from .._units import format_bytes
from ..exceptions import ConfigError
from ..predict import MIN_MARGIN_FRACTION, MemoryModel, fit_memory_model

#: A verified step below this fraction of the budget, under a batch that did not fit, is refined.
REFINE_BELOW = 0.9
#: Below the batch where activations overtake it, a step's peak can be flat in the batch: the
#: optimizer step (parameters, gradients and state) holds it. Two small batches whose peaks grow
#: at less than this fraction of the growth beyond them are on that flat part.
FLAT_SLOPE_FRACTION = 0.1
#: Extra probes spent finding a second point past the flat part, at most.
MAX_GROWTH_PROBES = 2


class DataLimit(Exception):
    """The task cannot form a batch of the asked size: it has only ``available`` samples."""

    def __init__(self, asked: int, available: int) -> None:
        super().__init__(f"asked for a batch of {asked}, the training data holds {available}")
        self.available = available


#: batch size -> peak bytes of one training step; may raise torch.OutOfMemoryError or DataLimit.
Measure = Callable[[int], int]


@dataclass(frozen=True)
class MemoryProbe(JsonRecord):
    """One measured step: its batch size, peak bytes (None after an OOM) and what it showed."""

    WHAT: ClassVar[str] = "a memory probe"

    batch_size: int
    peak_bytes: int | None
    status: str  # "fits" | "over_budget" | "oom"
    role: str  # "profile" (measured before, not repeated) | "probe" | "verify"


#: Bumped when a field of :class:`BatchSizeResult`'s JSON changes meaning.
BATCH_SIZE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class BatchSizeResult(JsonRecord):
    """The largest batch size that fits ``memory_budget``, and how it was found.

    A frozen, versioned record: :func:`find_batch_size` builds it, its ``batch_size`` Run holds
    :meth:`to_dict`, and the report reads it back through :meth:`from_dict`.
    """

    DERIVED: ClassVar[tuple[str, ...]] = ("runs",)
    max_batch_size: int
    memory_budget: int
    probes: tuple[MemoryProbe, ...]
    model: MemoryModel
    predicted_peak_bytes: float
    measured_peak_bytes: int | None
    #: Parameters + gradients + optimizer state: what the budget must hold before any activation.
    static_bytes: int
    device: str
    #: What bounds the answer: "memory", or "data" (the training data holds fewer samples).
    limited_by: str = "memory"
    static_detail: dict[str, int] = field(default_factory=dict)
    #: The largest batch that memory alone allows (above ``max_batch_size`` when data limits it;
    #: None given: ``max_batch_size``).
    memory_max_batch_size: int | None = None
    #: Samples in one epoch of the training data, when that bounds the answer.
    data_samples: int | None = None
    #: The Run this search was recorded as (with ``store=``).
    run_id: int | None = None
    schema_version: int = BATCH_SIZE_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.memory_max_batch_size is None:
            object.__setattr__(self, "memory_max_batch_size", self.max_batch_size)

    @property
    def runs(self) -> int:
        """Steps measured by this search (the profile's earlier measurement not counted)."""
        return sum(1 for p in self.probes if p.role != "profile")

    @classmethod
    def from_dict(cls, d: Any) -> BatchSizeResult:
        """The record back from :meth:`to_dict`'s JSON (a ``batch_size`` Run's result)."""
        what = "a batch-size search"
        stored_version(d, what=what, current=BATCH_SIZE_SCHEMA_VERSION)
        kw = record_fields(cls, d, what=what, derived=cls.DERIVED)
        kw["probes"] = tuple(MemoryProbe(**record_fields(MemoryProbe, p, what=f"{what}'s probe"))
                             for p in d["probes"])
        kw["model"] = MemoryModel(**record_fields(MemoryModel, d["model"], what=f"{what}'s memory model",
                                                  derived=MemoryModel.DERIVED))
        kw["static_detail"] = dict(d.get("static_detail") or {})
        return cls(**kw)


def _split_flat(points: Sequence[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``(flat, growth)``: the points on a flat start of the peak curve and those past it, or
    ``([], points)`` when the curve has no flat start (a line through every point is then right).

    A step's peak is the largest over its phases: at small batches the optimizer step can hold it,
    flat in the batch, until the activations of the forward/backward overtake it. A line through
    both parts misses each (digits, 3x1024 MLP, 45 MB: 109 instead of 843)."""
    pts = sorted({b: p for b, p in points}.items())
    if len(pts) < 3:
        return [], list(pts)
    for k in range(len(pts) - 1, 1, -1):
        flat, growth = pts[:k], pts[k:]
        (b0, p0), (b1, p1) = flat[0], flat[-1]
        g_b, g_p = growth[0]
        flat_slope = (p1 - p0) / (b1 - b0)
        growth_slope = (g_p - p1) / (g_b - b1)
        if growth_slope > 0 and abs(flat_slope) < FLAT_SLOPE_FRACTION * growth_slope:
            return list(flat), list(growth)
    return [], list(pts)


def _fit(points: Sequence[tuple[int, int]], budget: float) -> MemoryModel:
    """The memory line through the points past a flat start (all of them when there is none)."""
    flat, growth = _split_flat(points)
    if flat and len({b for b, _ in growth}) >= 2:
        return fit_memory_model(growth, budget)
    return fit_memory_model(points, budget)


class _Search:
    """Bookkeeping of one search: the measured points, the bounds, the probes in order."""

    def __init__(self, measure: Measure, budget: int, max_batch: int | None) -> None:
        self.measure, self.budget = measure, budget
        self.max_batch = max_batch
        self.probes: list[MemoryProbe] = []
        self.points: list[tuple[int, int]] = []
        self.fits: list[int] = []
        self.fails: list[int] = []
        self.limited_by = "memory"

    def add(self, batch_size: int, peak: int | None, role: str) -> MemoryProbe:
        if peak is None:
            status = "oom"
        else:
            status = "fits" if peak <= self.budget else "over_budget"
            self.points.append((batch_size, int(peak)))
        (self.fits if status == "fits" else self.fails).append(batch_size)
        probe = MemoryProbe(batch_size, None if peak is None else int(peak), status, role)
        self.probes.append(probe)
        return probe

    def run(self, batch_size: int, role: str) -> MemoryProbe:
        batch_size = self.clamp(batch_size)
        while True:
            try:
                peak: int | None = int(self.measure(batch_size))
            except DataLimit as limit:
                self.max_batch = limit.available
                self.limited_by = "data"
                batch_size = self.clamp(batch_size)
                continue
            except torch.OutOfMemoryError:
                peak = None
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            return self.add(batch_size, peak, role)

    def clamp(self, batch_size: float) -> int:
        b = max(1, int(batch_size))
        if self.max_batch is not None:
            b = min(b, self.max_batch)
        if self.fails:
            b = min(b, max(1, min(self.fails) - 1))
        return b

    @property
    def upper(self) -> int | None:
        return min(self.fails) if self.fails else None


def search_max_batch(
    measure: Measure,
    budget: int,
    *,
    known: Sequence[tuple[int, int]] = (),
    start: int = 16,
    max_batch: int | None = None,
    max_probes: int = 3,
    max_verify: int = 3,
    static_bytes: int = 0,
    device: str = "cpu",
    static_detail: dict[str, int] | None = None,
) -> BatchSizeResult:
    """Fit peak(B) = a + b·B from at most ``max_probes`` measured points and verify the answer.

    ``known`` holds points measured before (the profile's): they join the fit without a run.
    The probes go where they pin the line best: a small batch, then half-way and close to the
    extrapolated answer. The answer is verified by one step; when that step does not fit, the
    fit takes it in and the next answer is verified (at most ``max_verify`` times); after an
    out-of-memory error (a device smaller than the budget) the next try bisects between the
    largest batch that fitted and the one that ran out.
    """
    search = _Search(measure, budget, max_batch)
    for b, peak in known:
        search.add(int(b), int(peak), "profile")
    _probe(search, max(0, max_probes - len(search.points)), start, static_bytes)
    if len({b for b, _ in search.points}) < 2:
        # Every probe ran out of memory or hit the data limit: no line to fit.
        return _degenerate(search, static_bytes, device, static_detail or {})
    model = _fit(search.points, budget)
    answer = search.clamp(model.largest_batch(budget))
    for _ in range(max_verify):
        if answer < 1 or (search.upper is not None and search.upper <= 1):
            break
        probe = search.run(answer, "verify")
        if probe.status == "fits":
            # far below the budget although a bigger batch did not fit: the peak is not linear
            # (a convex curve lies below the line through the probes); refine between the two
            refined = _bracket_answer(search, model)
            if probe.peak_bytes is None or probe.peak_bytes >= REFINE_BELOW * budget or refined <= answer:
                break
            answer = refined
            continue
        if probe.status == "oom":
            # the device holds less than the budget: no peak to refit with, so bisect between
            # the largest batch that fitted and the one that ran out
            low = max(search.fits, default=0)
            answer = search.clamp((low + probe.batch_size) // 2)
            if answer <= low:
                break
            continue
        if len({b for b, _ in search.points}) >= 2:
            model = _fit(search.points, budget)
        answer = search.clamp(min(model.largest_batch(budget), probe.batch_size - 1))
    fits = [p for p in search.probes if p.status == "fits" and p.role == "verify"]
    fits.sort(key=lambda p: p.batch_size)
    best = fits[-1] if fits else _largest_fitting(search, static_bytes)
    return BatchSizeResult(
        max_batch_size=best.batch_size, memory_budget=int(budget), probes=tuple(search.probes),
        model=model, predicted_peak_bytes=model.predict(best.batch_size),
        measured_peak_bytes=best.peak_bytes, static_bytes=int(static_bytes), device=device,
        limited_by=search.limited_by if best.batch_size == search.max_batch else "memory",
        static_detail=static_detail or {},
    )


def _probe(search: _Search, probes: int, start: int, static_bytes: int) -> None:
    """The probes before the first fit: a small batch, then where they pin the line best; past a
    flat start of the curve, a second point on its growing part (at most MAX_GROWTH_PROBES more)."""
    if not search.points:
        search.run(start, "probe")
        probes -= 1
    while probes > 0:
        target = _next_probe(search, static_bytes)
        if target is None:
            break
        search.run(target, "probe")
        probes -= 1
    for _ in range(MAX_GROWTH_PROBES):
        flat, growth = _split_flat(search.points)
        if not flat or len({b for b, _ in growth}) >= 2:
            return
        target = search.clamp((max(b for b, _ in flat) + min(b for b, _ in growth)) // 2)
        if target in {b for b, _ in search.points}:
            return
        search.run(target, "probe")


def _bracket_answer(search: _Search, model: MemoryModel) -> int:
    """The answer from the line through the nearest measured points below and above the budget."""
    below = [(b, p) for b, p in search.points if p <= search.budget]
    above = [(b, p) for b, p in search.points if p > search.budget]
    if not below or not above:
        return 0
    b0, p0 = max(below)
    b1, p1 = min(above)
    if b1 <= b0 or p1 <= p0:
        return 0
    slope = (p1 - p0) / (b1 - b0)
    return search.clamp(b0 + (search.budget - model.margin_bytes - p0) / slope)


def _next_probe(search: _Search, static_bytes: int) -> int | None:
    """Where the next probe pins the line best: half-way to the answer, then close to it."""
    budget = search.budget
    distinct = sorted({b for b, _ in search.points})
    if len(distinct) >= 2:
        model = fit_memory_model(search.points, budget)
        guess_b = model.largest_batch(budget)
        target = int(0.9 * guess_b) if guess_b > 0 else distinct[0] // 2
    elif distinct:
        b1 = distinct[0]
        peak1 = dict(search.points)[b1]
        # one point: take the static bytes as the intercept for a first slope
        slope = (peak1 - static_bytes) / b1 if peak1 > static_bytes else peak1 / b1
        guess = (budget - static_bytes) / max(slope, 1.0)
        target = int(max(2 * b1, guess / 2)) if peak1 <= budget else max(1, b1 // 4)
    else:
        # only OOMs so far: go down
        target = max(1, (search.upper or 2) // 4)
    target = search.clamp(target)
    if target in distinct or (search.upper is not None and target >= search.upper):
        # nothing new to learn there: try the other side of the known points
        alternative = search.clamp(max(1, min(distinct or [target]) // 2))
        if alternative in distinct or alternative == target:
            return None
        target = alternative
    return target


def _largest_fitting(search: _Search, static_bytes: int) -> MemoryProbe:
    """The largest probe that fitted; a ConfigError when none did."""
    fitting = [p for p in search.probes if p.status == "fits"]
    if not fitting:
        raise ConfigError(
            f"memory_budget={format_bytes(search.budget)} does not hold one training step at any "
            f"batch size tried ({sorted(p.batch_size for p in search.probes)}); the model needs "
            f"{format_bytes(static_bytes)} for parameters, gradients and optimizer state alone."
        )
    return max(fitting, key=lambda p: p.batch_size)


def _degenerate(search: _Search, static_bytes: int, device: str, detail: dict[str, int]) -> BatchSizeResult:
    """No line could be fitted (OOM everywhere, or one batch size only): report what was seen."""
    best = _largest_fitting(search, static_bytes)
    peak = float(best.peak_bytes or 0)
    model = MemoryModel(intercept_bytes=peak, per_sample_bytes=0.0, residual_bytes=0.0,
                        margin_bytes=MIN_MARGIN_FRACTION * search.budget, points=len(search.points))
    return BatchSizeResult(
        max_batch_size=best.batch_size, memory_budget=int(search.budget), probes=tuple(search.probes),
        model=model, predicted_peak_bytes=peak, measured_peak_bytes=best.peak_bytes,
        static_bytes=int(static_bytes), device=device, limited_by=search.limited_by, static_detail=detail,
    )


def verify_prediction(
    measure: Measure,
    budget: int,
    predicted: MemoryModel,
    answer: int,
    *,
    max_verify: int = 3,
    static_bytes: int = 0,
    device: str = "cpu",
    static_detail: dict[str, int] | None = None,
) -> BatchSizeResult | None:
    """Start from a predicted memory model and its ``answer`` (``predict``: fake-tensor steps,
    nothing run) and verify it with one real step; when the measured peak differs from the
    predicted one, the prediction is scaled by the measured/predicted ratio and the new answer
    verified (at most ``max_verify`` real steps). ``None`` when no verified step fitted: the
    caller falls back to the probing search."""
    search = _Search(measure, budget, None)
    model = predicted
    best: MemoryProbe | None = None
    for _ in range(max_verify):
        if answer < 1:
            break
        probe = search.run(answer, "verify")
        expected = model.predict(probe.batch_size)
        if probe.status == "fits":
            best = probe if best is None or probe.batch_size > best.batch_size else best
            if probe.peak_bytes is None or probe.peak_bytes >= REFINE_BELOW * budget:
                break
        measured = probe.peak_bytes if probe.peak_bytes is not None else 1.1 * budget
        if expected <= 0:
            break
        scale = measured / expected
        model = MemoryModel(intercept_bytes=model.intercept_bytes * scale,
                            per_sample_bytes=model.per_sample_bytes * scale,
                            residual_bytes=model.residual_bytes, margin_bytes=model.margin_bytes,
                            points=model.points)
        nxt = search.clamp(model.largest_batch(budget))
        if probe.status == "fits" and nxt <= probe.batch_size:
            break
        if probe.status != "fits":
            nxt = min(nxt, probe.batch_size - 1)
        answer = nxt
    if best is None:
        return None
    return BatchSizeResult(
        max_batch_size=best.batch_size, memory_budget=int(budget), probes=tuple(search.probes), model=model,
        predicted_peak_bytes=model.predict(best.batch_size), measured_peak_bytes=best.peak_bytes,
        static_bytes=int(static_bytes), device=device, static_detail=static_detail or {},
    )
