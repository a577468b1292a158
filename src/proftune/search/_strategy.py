"""From correlations to strategy: what the finished study says to do with each param.

Per param: ``restrict`` (its range makes a hard constraint break: keep it where it holds),
``fix`` (little effect on the objective; say at which value, and what it costs), ``widen`` (the
best trials sit at a bound of its range) or ``keep`` (searching it still pays). Per constraint:
the param that drives it. No statement without evidence: at least ``MIN_TRIALS`` trials, a
Spearman |rho| of at least ``RHO`` whose bootstrap 95% interval excludes zero; below that the
statement is "not enough trials".
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from .._records import JsonRecord
from ._constraints import Constraint, Objective
from ._records import TrialRecord
from ._space import Param, Space

__all__ = ["MIN_TRIALS", "RHO", "Statement", "strategy"]

#: Trials needed before any statement about a param.
MIN_TRIALS = 8
#: |Spearman rho| at or above which a param "drives" a metric.
RHO = 0.5
#: |Spearman rho| below which (with an interval that holds zero) a param has "little effect".
LITTLE = 0.3
BOOTSTRAP = 400


class RhoInterval(TypedDict):
    """A Spearman rho with its bootstrap 95% interval, over ``n`` trials."""

    rho: float
    ci95: list[float]
    n: int


class Cost(RhoInterval):
    """What a param costs: the profile ``metric`` it drives."""

    metric: str


class Evidence(TypedDict, total=False):
    """The numbers behind a statement: the trials (``n``) and, by its action, the correlations,
    the bound kept (a text) or widened past, the best value and what fixing it costs."""

    n: int
    rho: float
    ci95: list[float]
    param: str
    metric: str
    bound: str | float | None
    constraint: str
    value: object
    objective: RhoInterval | None
    cost: Cost
    side: str
    best_values: list[object]


@dataclass(frozen=True)
class Statement(JsonRecord):
    """One line of strategy: ``action`` on ``subject`` with the numbers behind it."""

    WHAT: ClassVar[str] = "a strategy statement"
    kind: str  # "param" or "constraint"
    subject: str  # the param name, or the constraint text
    action: str  # restrict, fix, widen, keep, not enough trials; driven by / no driver (constraints)
    text: str
    evidence: Evidence = field(default_factory=lambda: Evidence())


# -- statistics -----------------------------------------------------------------------------------
def _ranks(xs: Sequence[float]) -> list[float]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rho (Pearson of the ranks, ties averaged); 0 when either side is constant."""
    if len(xs) < 3:
        return 0.0
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def bootstrap_rho(xs: Sequence[float], ys: Sequence[float], *, seed: int = 0,
                  n: int = BOOTSTRAP) -> tuple[float, float, float]:
    """rho and its 95% bootstrap interval (percentile method)."""
    rho = spearman(xs, ys)
    rng = random.Random(seed)
    idx = range(len(xs))
    draws = []
    for _ in range(n):
        pick = [rng.choice(idx) for _ in idx]
        draws.append(spearman([xs[i] for i in pick], [ys[i] for i in pick]))
    draws.sort()
    return rho, draws[int(0.025 * (n - 1))], draws[int(0.975 * (n - 1))]


def _numeric(p: Param, v: Any) -> float | None:
    """A param value on the axis correlations use: log for log params, the index for categoricals."""
    if p.type == "categorical":
        return float(p.choices.index(v)) if v in p.choices else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return math.log(v) if (p.log and v > 0) else float(v)


def _pairs(p: Param, records: Sequence[TrialRecord], value: Any) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for r in records:
        x = _numeric(p, r.params.get(p.name))
        y = value(r)
        if x is not None and y is not None and math.isfinite(y):
            xs.append(x)
            ys.append(float(y))
    return xs, ys


@dataclass
class _Corr:
    rho: float
    low: float
    high: float
    n: int

    @property
    def drives(self) -> bool:
        return abs(self.rho) >= RHO and (self.low > 0 or self.high < 0)

    @property
    def little(self) -> bool:
        return abs(self.rho) < LITTLE and self.low <= 0 <= self.high

    def to_dict(self) -> RhoInterval:
        return {"rho": round(self.rho, 3), "ci95": [round(self.low, 3), round(self.high, 3)], "n": self.n}

    def text(self) -> str:
        return f"rho {self.rho:+.2f}, 95% CI [{self.low:+.2f}, {self.high:+.2f}], n={self.n}"


def _corr(p: Param, records: Sequence[TrialRecord], value: Any, seed: int) -> _Corr | None:
    xs, ys = _pairs(p, records, value)
    if len(xs) < MIN_TRIALS or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    rho, low, high = bootstrap_rho(xs, ys, seed=seed)
    return _Corr(rho, low, high, len(xs))


def _partial(p: Param, space: Space, records: Sequence[TrialRecord], value: Any, seed: int, *,
             peak: bool = False) -> _Corr | None:
    """Partial Spearman rho of ``p`` with ``value`` given the other params (ranks, least squares),
    so that a param which only rides along with a strong one is not credited with its effect.

    Each param enters twice: its rank (a monotone effect) and its squared centred rank (with the
    first, a peak anywhere in the range); ``peak`` asks about the second of ``p``.
    """
    import numpy as np

    params = [q for q in space.params if q.type != "categorical" or len(q.choices) > 1]
    rows = []
    for r in records:
        xs = [_numeric(q, r.params.get(q.name)) for q in params]
        y = value(r)
        if all(x is not None for x in xs) and y is not None and math.isfinite(y):
            rows.append([*(float(x) for x in xs if x is not None), float(y)])
    if len(rows) < MIN_TRIALS:
        return None
    data = np.array(rows)
    j = params.index(p)
    if len(set(data[:, j])) < 2 or len(set(data[:, -1])) < 2:
        return None

    def rho_of(d: Any) -> float:
        ranked = np.column_stack([_ranks(list(col)) for col in d.T])
        # the others' effects: rank and squared centred rank, a parabola with its top anywhere
        centred = ranked[:, :-1] - ranked[:, :-1].mean(axis=0)
        peaked = centred**2
        others = np.column_stack([np.ones(len(d)), np.delete(ranked[:, :-1], j, axis=1),
                                  np.delete(peaked, j, axis=1)])
        own = peaked[:, j] if peak else ranked[:, j]
        resid = [v - others @ np.linalg.lstsq(others, v, rcond=None)[0] for v in (own, ranked[:, -1])]
        sx, sy = float(np.linalg.norm(resid[0])), float(np.linalg.norm(resid[1]))
        return float(resid[0] @ resid[1]) / (sx * sy) if sx > 1e-12 and sy > 1e-12 else 0.0

    rng = np.random.default_rng(seed)
    draws = sorted(rho_of(data[rng.integers(0, len(data), len(data))]) for _ in range(BOOTSTRAP // 2))
    k = len(draws)
    return _Corr(rho_of(data), draws[int(0.025 * (k - 1))], draws[int(0.975 * (k - 1))], len(data))


# -- the statements -------------------------------------------------------------------------------
def _metric_of(metric: str) -> Any:
    return lambda r: r.metrics.get(metric)


def _objective_of(i: int) -> Any:
    return lambda r: r.values[i] if r.values else None


def strategy(records: Sequence[TrialRecord], space: Space, objectives: Sequence[Objective],
             constraints: Sequence[Constraint], *, scan: Any = None, seed: int = 0) -> list[Statement]:
    """Per constraint its driving param; per param restrict / fix / widen / keep, with the numbers."""
    out = [_constraint_statement(c, records, space, scan, seed) for c in constraints if c.is_profile]
    complete = [r for r in records if r.state == "complete" and r.values]
    drivers = {s.evidence.get("param"): s for s in out if s.action == "driven by"}
    for p in space.params:
        out.append(_param_statement(p, space, complete, records, objectives, drivers, scan, seed))
    return out


def _constraint_statement(c: Constraint, records: Sequence[TrialRecord], space: Space, scan: Any,
                          seed: int) -> Statement:
    measured = [r for r in records if c.metric in r.metrics]
    if len(measured) < MIN_TRIALS:
        return Statement("constraint", c.text, "not enough trials",
                         f"{c.text}: not enough trials to say which param drives it "
                         f"({len(measured)} measured, {MIN_TRIALS} needed)", {"n": len(measured)})
    found: list[tuple[Param, _Corr]] = []
    for p in space.params:
        corr = _corr(p, measured, _metric_of(c.metric), seed)
        if corr is not None:
            found.append((p, corr))
    if not found or not any(k.drives for _, k in found):
        best = max(found, key=lambda pk: abs(pk[1].rho), default=None)
        note = f" (strongest: {best[0].name}, {best[1].text()})" if best else ""
        return Statement("constraint", c.text, "no driver",
                         f"{c.text}: no param drives it{note}", {"n": len(measured)})
    p, k = max(found, key=lambda pk: abs(pk[1].rho))
    bound = _scan_bound(scan, p.name)
    tail = f"; the scan keeps {bound}" if bound else ""
    return Statement("constraint", c.text, "driven by",
                     f"{c.text} is driven by {p.name} ({k.text()}){tail}",
                     {"param": p.name, **k.to_dict(), "metric": c.metric})


def _scan_bound(scan: Any, name: str) -> str | None:
    for b in getattr(scan, "bounds", None) or []:
        if b.param == name:
            return f"{b.param} {b.op} {list(b.value) if b.op == 'in' else b.value}"
    return None


def _param_statement(p: Param, space: Space, complete: Sequence[TrialRecord], records: Sequence[TrialRecord],
                     objectives: Sequence[Objective], drivers: dict[str | None, Statement], scan: Any,
                     seed: int) -> Statement:
    if p.name in drivers:
        return _restrict(p, records, drivers[p.name], scan)
    if len(complete) < MIN_TRIALS:
        return Statement("param", p.name, "not enough trials",
                         f"{p.name}: not enough trials ({len(complete)} complete, {MIN_TRIALS} needed)",
                         {"n": len(complete)})
    o = objectives[0]
    effect = _partial(p, space, complete, _objective_of(0), seed)
    widen = _widen(p, complete, o, effect)
    if widen is not None:
        return widen
    peak = _partial(p, space, complete, _objective_of(0), seed, peak=True)
    if effect is not None and effect.little and (peak is None or peak.little):
        cost = _cost(p, records, seed)
        best = _best_value(p, complete, o)
        text = (f"fix {p.name} at {best}: little effect on {o.metric} ({effect.text()})"
                + (f"; it costs {cost[0]} ({cost[1].text()})" if cost else ""))
        return Statement("param", p.name, "fix", text,
                         {"value": best, "objective": effect.to_dict(),
                          **({"cost": {"metric": cost[0], **cost[1].to_dict()}} if cost else {})})
    detail = f" ({o.metric}: {effect.text()})" if effect else ""
    return Statement("param", p.name, "keep", f"keep searching {p.name}{detail}",
                     {"objective": effect.to_dict() if effect else None})


def _restrict(p: Param, records: Sequence[TrialRecord], driver: Statement, scan: Any) -> Statement:
    """Where ``p`` keeps the constraint: the scan's bound, else the range of the feasible trials."""
    bound = _scan_bound(scan, p.name)
    if bound is None:
        ok = [r.params[p.name] for r in records if p.name in r.params and r.state in ("complete", "pruned")]
        if ok and p.type != "categorical":
            bound = f"{p.name} in [{min(ok)}, {max(ok)}]"
        elif ok:
            bound = f"{p.name} in {sorted(set(ok), key=str)}"
    ev = driver.evidence
    text = (f"restrict {p.name}" + (f" to {bound}" if bound else "")
            + f": it drives {driver.subject} (rho {ev['rho']:+.2f}, 95% CI {ev['ci95']}, n={ev['n']})")
    return Statement("param", p.name, "restrict", text, {"bound": bound, "constraint": driver.subject, **ev})


def _cost(p: Param, records: Sequence[TrialRecord], seed: int) -> tuple[str, _Corr] | None:
    for metric in ("step_time_ms", "peak_memory_bytes", "latency_ms"):
        k = _corr(p, [r for r in records if metric in r.metrics], _metric_of(metric), seed)
        if k is not None and k.drives:
            return metric, k
    return None


def _best_value(p: Param, complete: Sequence[TrialRecord], o: Objective) -> Any:
    sign = -1.0 if o.direction == "maximize" else 1.0
    best = min(complete, key=lambda r: sign * (r.values or [0.0])[0])
    return best.params.get(p.name)


def _widen(p: Param, complete: Sequence[TrialRecord], o: Objective, effect: _Corr | None) -> Statement | None:
    """The objective improves toward one end of the range and the best trials sit at that end."""
    if p.type == "categorical" or p.low is None or p.high is None or effect is None or not effect.drives:
        return None
    lo, hi = _numeric(p, p.low), _numeric(p, p.high)
    sign = -1.0 if o.direction == "maximize" else 1.0
    top = sorted(complete, key=lambda r: sign * (r.values or [0.0])[0])[:3]
    xs = [_numeric(p, r.params.get(p.name)) for r in top]
    if lo is None or hi is None or hi <= lo or any(x is None for x in xs):
        return None
    better_up = (effect.rho > 0) == (o.direction == "maximize")
    position = [((x or 0.0) - lo) / (hi - lo) for x in xs]
    at_end = min(position) >= 0.8 if better_up else max(position) <= 0.2
    if not at_end:
        return None
    side, bound = ("above", p.high) if better_up else ("below", p.low)
    return Statement("param", p.name, "widen",
                     f"widen {p.name} {side} {bound}: {o.metric} improves toward it ({effect.text()}) "
                     f"and the 3 best trials sit in the outer fifth of the range",
                     {"side": side, "bound": bound, "objective": effect.to_dict(),
                      "best_values": [r.params.get(p.name) for r in top]})
