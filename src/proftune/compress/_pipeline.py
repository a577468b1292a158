"""The sweep's records and decisions: a measured Candidate, the Pareto front, the selection."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from .._records import JsonRecord

__all__ = [
    "GOAL_METRICS",
    "LATENCY_TIE",
    "Candidate",
    "beats",
    "choose",
    "mark_pareto",
    "select",
]

#: Relative difference of batch-1 latency treated as a tie (timing noise on a shared machine).
LATENCY_TIE = 0.05
#: --goal -> the candidate field it optimises, a metric name whose direction ``proftune.metrics`` gives.
GOAL_METRICS = {"latency": "latency_ms", "size": "size_bytes", "macs": "macs", "params": "params"}


@dataclass
class Candidate(JsonRecord):
    """One compressed model, measured as saved.

    ``params``/``macs`` of a quantized model are those of the float model it was converted from
    (INT8 changes the bytes per weight, not their number); ``latency_ms`` is one forward at
    batch 1 and ``latency_batch_ms`` at the task's ``batch_size`` (median, fixed threads).
    """

    WHAT: ClassVar[str] = "a compressed candidate"

    method: str
    ratio: float
    metric: float
    metric_drop: float
    params: int
    macs: int
    size_bytes: int
    latency_ms: float
    latency_batch_ms: float
    batch_size: int
    nonzero_params: int | None = None
    sparsity: float | None = None
    sparse_size_bytes: int | None = None
    quant_backend: str | None = None
    backend_ms: dict[str, float | str] = field(default_factory=dict)
    distilled: bool = False
    finetune_epochs: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    #: How the file is saved: state, torchscript, export, onnx or aoti (``_checkpoint.LOAD_LINES``
    #: has the load line).
    format: str = "state"
    reload_max_abs_diff: float = 0.0
    #: A compiled candidate: the largest |output - eager output| over the validation data.
    eager_max_abs_diff: float | None = None
    within_budget: bool = False
    pareto: bool = False
    notes: list[str] = field(default_factory=list)
    path: str | None = None


def _key(c: Candidate, goal_key: str, goal_up: bool) -> float:
    """``goal_key`` of ``c`` signed so that smaller is better."""
    value = float(getattr(c, goal_key))
    return -value if goal_up else value


def mark_pareto(cands: Sequence[Candidate], goal_key: str, *, metric_up: bool, goal_up: bool = False) -> None:
    """Flag candidates no other beats on both the metric and ``goal_key`` (``*_up``: higher is
    better, from ``proftune.metrics``)."""
    for c in cands:
        c.pareto = True
        for o in cands:
            if o is c:
                continue
            better_metric = o.metric >= c.metric if metric_up else o.metric <= c.metric
            better_goal = _key(o, goal_key, goal_up) <= _key(c, goal_key, goal_up)
            strictly = (o.metric != c.metric) or (getattr(o, goal_key) != getattr(c, goal_key))
            if better_metric and better_goal and strictly:
                c.pareto = False
                break


def beats(cand: Candidate, baseline: Candidate, goal_key: str, *, goal_up: bool = False) -> bool:
    """Whether ``cand`` is better than ``baseline`` on the goal beyond measurement noise: batch-1
    latency by more than :data:`LATENCY_TIE`, a count or size strictly."""
    c, b = float(getattr(cand, goal_key)), float(getattr(baseline, goal_key))
    if not (math.isfinite(c) and math.isfinite(b)):
        return False
    if goal_key == "latency_ms":
        return c < b * (1.0 - LATENCY_TIE)
    return c > b if goal_up else c < b


def choose(cands: list[Candidate], *, goal: str, metric: str, max_drop: float, metric_up: bool,
           goal_up: bool) -> tuple[Candidate | None, list[str]]:
    """The compressed model to hand back, or None to keep the uncompressed one (``cands[0]``,
    the baseline), and the notes that say why: every candidate's drop against the baseline, the
    Pareto front, the best on the goal within ``max_drop``, kept only if it beats the baseline on
    the goal beyond measurement noise (:func:`beats`)."""
    baseline = cands[0]
    for c in cands:
        c.metric_drop = (baseline.metric - c.metric) if metric_up else (c.metric - baseline.metric)
    goal_key = GOAL_METRICS[goal]
    mark_pareto(cands, goal_key, metric_up=metric_up, goal_up=goal_up)
    selected = select(cands, goal_key, max_drop, goal_up=goal_up)
    if selected is None:
        return None, [f"no candidate keeps the {metric} drop within {max_drop}; nothing saved. Loosen "
                      "--max-accuracy-drop, lower --ratios or fine-tune longer."]
    if not beats(selected, baseline, goal_key, goal_up=goal_up):
        where = " at batch 1" if goal_key == "latency_ms" else ""
        tie = (f"; a latency within {LATENCY_TIE:.0%} is a tie within timing noise"
               if goal_key == "latency_ms" else "")
        return None, [f"kept the uncompressed model: the best candidate within the {metric} budget "
                      f"({selected.method}) is not better on --goal {goal}{where} "
                      f"({getattr(selected, goal_key):.4g} vs {getattr(baseline, goal_key):.4g} uncompressed{tie}); "
                      "the model may be too small for these methods to pay on this device."]
    return selected, []


def select(cands: Sequence[Candidate], goal_key: str, max_drop: float, *,
           goal_up: bool = False) -> Candidate | None:
    """The candidate best on ``goal_key`` whose metric drop is at most ``max_drop``; ties go to the
    better metric (for latency: to the faster one at the task's batch size). ``None`` when no
    compressed candidate fits the budget."""
    for c in cands:
        c.within_budget = c.metric_drop <= max_drop + 1e-12
    fits = [c for c in cands if c.within_budget and c.method != "baseline"]
    if not fits:
        return None
    if goal_key == "latency_ms":
        # batch-1 latencies within LATENCY_TIE of the fastest are a tie within timing noise;
        # the latency at the task's batch size decides between them
        fastest = min(c.latency_ms for c in fits)
        close = [c for c in fits if c.latency_ms <= fastest * (1 + LATENCY_TIE)]
        return min(close, key=lambda c: (c.latency_batch_ms, c.metric_drop))
    return min(fits, key=lambda c: (_key(c, goal_key, goal_up), c.metric_drop))
