"""Feasibility scan: profile a low-discrepancy sample of the space before any training, learn
where the hard constraints hold, and restrict the space to it.

The scan gates (profiles, never trains) Halton points of the space in rounds, and after each
round fits per-param bounds: a greedy box learner that adds, one at a time, the bound (an upper
or lower limit on a numeric param, or a dropped choice of a categorical one) that removes the
most infeasible scanned points for the fewest feasible ones, until the kept points are
feasible enough. Where the data is monotone in one param this is that param's bound; where
several params drive a constraint it is a box of them. It stops once the bounds have not
changed for ``patience`` rounds. Each numeric bound is then refined by bisection along its
param (a few more profiles) to within one grid step of where the constraint starts to break.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypedDict

from .._records import JsonRecord, Reader, each, mapping, record_fields
from ..task import Task
from ._constraints import Constraint
from ._gate import ProfileGate, free_memory, is_oom
from ._space import Param, Space

__all__ = ["Bound", "ScanPoint", "ScanResult", "fit_bounds", "restrict_space", "run_scan"]

#: The box learner stops once at most this share of the kept scanned points is infeasible.
TARGET_INFEASIBLE = 0.05
#: A bound is worth its cost when it removes this many infeasible points per feasible point lost.
GAIN = 1.0
#: A bound must separate infeasible from feasible points beyond chance at this level (over params).
ALPHA = 0.05


class _Located(TypedDict):
    params: dict[str, Any]
    feasible: bool


class ScanPoint(_Located, total=False):
    """A scanned configuration: its params and whether it meets the hard constraints (all that
    :func:`fit_bounds` reads); a profiled one also has the gate's metrics and reasons."""

    metrics: dict[str, float]
    reasons: list[str]


@dataclass(frozen=True)
class Bound:
    """One restriction of a param: ``op`` is ``<=``, ``>=`` (numeric) or ``in`` (categorical)."""

    param: str
    op: str
    value: Any
    agree: int = 0
    total: int = 0
    constraints: tuple[str, ...] = ()

    def keeps(self, x: Any) -> bool:
        if self.op == "in":
            return bool(x in self.value)
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return True
        return bool(x <= self.value) if self.op == "<=" else bool(x >= self.value)

    def describe(self) -> str:
        bound = (f"{self.param} in {list(self.value)}" if self.op == "in"
                 else f"{self.param} {self.op} {_fmt(self.value)}")
        keeps = " and ".join(self.constraints) or "the constraints"
        return f"{bound} keeps {keeps}: {self.agree} of {self.total} scanned profiles agree"

    def to_dict(self) -> dict[str, object]:
        return {"param": self.param, "op": self.op,
                "value": list(self.value) if self.op == "in" else self.value,
                "agree": self.agree, "total": self.total, "constraints": list(self.constraints),
                "text": self.describe()}

    @classmethod
    def from_dict(cls, d: object) -> Bound:
        kw = record_fields(cls, mapping(d, what="a scan bound"), what="a scan bound", derived=("text",))
        value = tuple(kw["value"]) if kw["op"] == "in" else kw["value"]
        return cls(**{**kw, "value": value, "agree": int(kw.get("agree", 0)), "total": int(kw.get("total", 0)),
                      "constraints": tuple(kw.get("constraints", ()))})


@dataclass(frozen=True)
class ScanResult(JsonRecord):
    """What the scan measured, the bounds it fitted, and what they cost (stored with the study and
    in a tune Run)."""

    WHAT: ClassVar[str] = "a feasibility scan"
    READERS: ClassVar[dict[str, Reader]] = {"bounds": each(Bound.from_dict)}

    constraints: list[str]
    points: list[ScanPoint]
    bounds: list[Bound]
    duration_s: float
    profiles: int
    stopped_early: bool
    feasible_share: float
    kept_infeasible_share: float
    notes: list[str] = field(default_factory=list)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# -- the box learner ------------------------------------------------------------------------------
def _candidates(space: Space, kept: Sequence[ScanPoint]) -> list[Bound]:
    """Every single restriction that removes at least one kept point."""
    out: list[Bound] = []
    for p in space.params:
        values = [pt["params"][p.name] for pt in kept if p.name in pt["params"]]
        if not values:
            continue
        if p.type == "categorical":
            present = list(dict.fromkeys(values))
            for drop in present:
                rest = tuple(c for c in p.choices if c != drop)
                if rest:
                    out.append(Bound(p.name, "in", rest))
            continue
        distinct = sorted(set(values))
        out += [Bound(p.name, "<=", v) for v in distinct[:-1]]
        out += [Bound(p.name, ">=", v) for v in distinct[1:]]
    return out


def fit_bounds(space: Space, points: Sequence[ScanPoint], *,
               target: float = TARGET_INFEASIBLE, max_bounds: int = 6) -> list[Bound]:
    """Greedy box: bounds that keep the feasible scanned points and drop the infeasible ones.

    ``points``: ``{"params": {...}, "feasible": bool}``. No bound is fitted when every point is
    feasible, when none is, or when no restriction removes ``GAIN`` infeasible points per
    feasible point lost (the constraint does not follow the params one at a time).
    """
    kept = list(points)
    feasible = sum(1 for pt in kept if pt["feasible"])
    if feasible == 0 or feasible == len(kept):
        return []
    chosen: list[Bound] = []
    for _ in range(max_bounds):
        bad = sum(1 for pt in kept if not pt["feasible"])
        if bad <= target * len(kept):
            break
        best, best_score = None, 0.0
        alpha = ALPHA / max(1, len(space.params))
        for b in _candidates(space, kept):
            out = [pt for pt in kept if not b.keeps(pt["params"].get(b.param))]
            removed_bad = sum(1 for pt in out if not pt["feasible"])
            lost = len(out) - removed_bad
            score = removed_bad - GAIN * lost
            if removed_bad and score > best_score and _separates(b, kept, out, alpha):
                best, best_score = b, score
        if best is None:
            break
        kept = [pt for pt in kept if best.keeps(pt["params"].get(best.param))]
        chosen.append(best)
    return _merge(chosen)


def _separates(b: Bound, kept: Sequence[ScanPoint], out: Sequence[ScanPoint], alpha: float) -> bool:
    """Whether feasibility follows ``b``'s param beyond chance, one-sided at ``alpha``: for a numeric
    bound, the infeasible points' values lie beyond the feasible ones' (Mann-Whitney U); for a
    dropped choice, it is infeasible more often than the rest (Fisher's exact test). Coin-flip
    feasibility fits no bound."""
    from scipy.stats import fisher_exact, mannwhitneyu

    if b.op == "in":
        out_bad = sum(1 for pt in out if not pt["feasible"])
        in_bad = sum(1 for pt in kept if not pt["feasible"]) - out_bad
        in_good = len(kept) - len(out) - in_bad
        _, p = fisher_exact([[out_bad, len(out) - out_bad], [in_bad, in_good]], alternative="greater")
        return bool(p < alpha)
    bad = [pt["params"][b.param] for pt in kept if not pt["feasible"] and b.param in pt["params"]]
    good = [pt["params"][b.param] for pt in kept if pt["feasible"] and b.param in pt["params"]]
    if not bad or not good:
        return False
    res = mannwhitneyu(bad, good, alternative="greater" if b.op == "<=" else "less")
    return bool(res.pvalue < alpha)


def _merge(bounds: Sequence[Bound]) -> list[Bound]:
    """One bound per param and side: the tightest."""
    merged: dict[tuple[str, str], Bound] = {}
    for b in bounds:
        key = (b.param, b.op)
        old = merged.get(key)
        if old is None:
            merged[key] = b
        elif b.op == "in":
            merged[key] = replace(b, value=tuple(v for v in old.value if v in b.value))
        else:
            tighter = min(old.value, b.value) if b.op == "<=" else max(old.value, b.value)
            merged[key] = replace(b, value=tighter)
    return list(merged.values())


# -- applying bounds ------------------------------------------------------------------------------
def restrict_space(space: Space, bounds: Sequence[Bound]) -> Space:
    """``space`` with each param's range (or choices) narrowed by ``bounds``, snapped to its grid."""
    params = []
    for p in space.params:
        q = p
        for b in (b for b in bounds if b.param == p.name):
            q = _narrow(q, b)
        params.append(q)
    return replace(space, params=tuple(params))


def _narrow(p: Param, b: Bound) -> Param:
    if b.op == "in":
        choices = tuple(c for c in p.choices if c in b.value)
        return replace(p, choices=choices or p.choices)
    assert p.low is not None
    assert p.high is not None
    if b.op == "<=":
        high = min(float(p.high), float(b.value))
        if p.step:
            high = p.low + math.floor((high - p.low) / p.step + 1e-9) * p.step
        return replace(p, high=max(high, p.low) if p.type != "int" else int(max(high, p.low)))
    low = max(float(p.low), float(b.value))
    if p.step:
        low = p.low + math.ceil((low - p.low) / p.step - 1e-9) * p.step
    return replace(p, low=min(low, p.high) if p.type != "int" else int(min(low, p.high)))


def grid_step(p: Param, points: int = 16) -> float:
    """One grid step of a numeric param: its ``step``, 1 for ints, else 1/``points`` of the range."""
    assert p.low is not None
    assert p.high is not None
    if p.step:
        return float(p.step)
    if p.type == "int":
        return 1.0
    if p.log:
        return (math.log(p.high) - math.log(p.low)) / points
    return (p.high - p.low) / points


# -- the scan -------------------------------------------------------------------------------------
def _halton_points(space: Space, n: int, seed: int) -> list[dict[str, object]]:
    """``n`` configurations of ``space`` from a scrambled Halton sequence (Optuna's QMC sampler)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = optuna.samplers.QMCSampler(qmc_type="halton", scramble=True, seed=seed,
                                             warn_independent_sampling=False)
        study = optuna.create_study(sampler=sampler)
        out = []
        for _ in range(n):
            trial = study.ask()
            out.append(space.suggest(trial))
            study.tell(trial, 0.0)
    return out


class _Prober:
    """Gates configurations for the scan: feasible or not, with the measured metrics."""

    def __init__(self, task: Task, space: Space, gate: ProfileGate) -> None:
        self.task, self.space, self.gate = task, space, gate
        self.points: list[ScanPoint] = []
        self._seen: dict[str, ScanPoint] = {}

    def __call__(self, params: Mapping[str, object]) -> ScanPoint | None:
        config = {**self.space.fixed, **params}
        if self.space.forbidden(config) is not None:
            return None
        key = repr(sorted(params.items()))
        if key in self._seen:  # a small or discrete space: one profile per configuration
            return self._seen[key]
        try:
            g = self.gate.check(self.task, config)
            pt = ScanPoint(params=dict(params), feasible=g.feasible, metrics=g.metrics, reasons=g.reasons)
        except Exception as exc:
            if not is_oom(exc):
                raise
            pt = ScanPoint(params=dict(params), feasible=False, metrics={}, reasons=["out of memory"])
        finally:
            free_memory()
        self.points.append(pt)
        self._seen[key] = pt
        return pt


def run_scan(task: Task, space: Space, constraints: Sequence[Constraint], *, n: int = 16, rounds: int = 4,
             patience: int = 1, seed: int = 0, device: str = "auto", gate_steps: int = 2) -> ScanResult:
    """Profile up to ``n`` Halton configurations of ``space`` (no training) and fit bounds.

    The sample is gated in ``rounds`` rounds; once the fitted bounds did not change for
    ``patience`` rounds the scan stops early. Then each numeric bound is refined by bisection
    (at most a few profiles each) to within one grid step.
    """
    started = time.perf_counter()
    hard = [c for c in constraints if c.is_profile]
    gate = ProfileGate(hard, steps=gate_steps, warmup=1, device=device, seed=seed)
    probe = _Prober(task, space, gate)
    configs = _halton_points(space, n, seed)
    size = max(1, math.ceil(n / rounds))
    bounds: list[Bound] = []
    stable, stopped_early = 0, False
    for start in range(0, n, size):
        for params in configs[start:start + size]:
            probe(params)
        new = fit_bounds(space, probe.points)
        settled = bool(new) or all(pt["feasible"] for pt in probe.points)  # no bound yet: keep looking
        stable = stable + 1 if (new == bounds and settled and probe.points) else 0
        bounds = new
        if stable >= patience and start + size < n:
            stopped_early = True
            break
    notes: list[str] = []
    bounds = _refine(space, bounds, probe, notes)
    return _result(hard, probe.points, bounds, started, stopped_early, notes)


def _result(hard: Sequence[Constraint], points: list[ScanPoint], bounds: list[Bound], started: float,
            stopped_early: bool, notes: list[str]) -> ScanResult:
    texts = tuple(c.text for c in hard)
    total = len(points)
    bounds = [replace(b, agree=_agree_one(b, bounds, points), total=total, constraints=texts) for b in bounds]
    kept = [pt for pt in points if all(b.keeps(pt["params"].get(b.param)) for b in bounds)]
    feasible = sum(1 for pt in points if pt["feasible"])
    if total and feasible == total:
        notes.append(f"every scanned profile ({total}) meets the constraints: nothing to restrict")
    elif total and feasible == 0:
        notes.append(f"no scanned profile ({total}) meets the constraints: nothing to keep")
    elif not bounds:
        notes.append("no param bound separates the feasible profiles from the others; the gate decides per trial")
    return ScanResult(
        constraints=list(texts), points=points, bounds=bounds, duration_s=time.perf_counter() - started,
        profiles=total, stopped_early=stopped_early,
        feasible_share=feasible / total if total else 0.0,
        kept_infeasible_share=(sum(1 for pt in kept if not pt["feasible"]) / len(kept)) if kept else 0.0,
        notes=notes)


def _agree_one(b: Bound, bounds: Sequence[Bound], points: Sequence[ScanPoint]) -> int:
    """Scanned points that agree with ``b``: inside it and feasible, outside it and infeasible, or
    inside it, infeasible and outside another bound (which explains them)."""
    n = 0
    for pt in points:
        inside = b.keeps(pt["params"].get(b.param))
        if inside == pt["feasible"]:
            n += 1
        elif inside and not all(o.keeps(pt["params"].get(o.param)) for o in bounds):
            n += 1
    return n


def _refine(space: Space, bounds: list[Bound], probe: _Prober, notes: list[str],
            max_probes: int = 3) -> list[Bound]:
    """Bisect each numeric bound between the last feasible and the first infeasible value."""
    out = []
    for b in bounds:
        p = space.param(b.param)
        if b.op == "in" or p.type == "categorical":
            out.append(b)
            continue
        others = [o for o in bounds if o is not b]
        out.append(_bisect(p, b, others, probe, max_probes, notes))
    return out


def _bisect(p: Param, b: Bound, others: Sequence[Bound], probe: _Prober, max_probes: int,
            notes: list[str]) -> Bound:
    """Move ``b`` to the last feasible value of its param (others held inside their bounds)."""
    upper = b.op == "<="

    def within_others(pt: ScanPoint) -> bool:
        return all(o.keeps(pt["params"].get(o.param)) for o in others)

    inside = [pt for pt in probe.points if p.name in pt["params"] and pt["feasible"]
              and b.keeps(pt["params"][p.name])]
    outside = [pt for pt in probe.points if p.name in pt["params"] and not pt["feasible"]
               and not b.keeps(pt["params"][p.name]) and within_others(pt)]
    if not inside or not outside:
        return b
    edge = max if upper else min
    good = edge(pt["params"][p.name] for pt in inside)
    worst = (min if upper else max)(outside, key=lambda pt: pt["params"][p.name])
    bad = worst["params"][p.name]
    step = grid_step(p)
    for _ in range(max_probes):
        gap = (math.log(bad) - math.log(good)) if (p.log and not p.step and p.type == "float") else bad - good
        if abs(gap) <= step + 1e-12:
            break
        mid = math.exp((math.log(good) + math.log(bad)) / 2) if (p.log and p.type == "float" and not p.step) \
            else (good + bad) / 2
        x = p.snap(mid)
        if x in (good, bad):
            break
        pt = probe({**worst["params"], p.name: x})
        if pt is None:
            break
        if pt["feasible"]:
            good = x
        else:
            bad = x
    notes.append(f"{p.name}: bound refined by bisection to {_fmt(good)} (first infeasible {_fmt(bad)})")
    return replace(b, value=good)
