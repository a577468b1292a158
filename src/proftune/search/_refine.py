"""The end of a known budget refines around the leaders: repeats and neighbours.

TPE finds good regions early and then spends its evaluations spread over them, while a noisy
objective hides which of its good configurations is truly best (the winner's curse). Where the
number of evaluations is known (``budget`` of at least ``MIN_BUDGET``), its last ``2 x share``
refine instead of sampling:

* every second evaluation of that phase is a repeat of a leader: the least-evaluated of the
  ``TOP`` best by :func:`~proftune.search._reeval.pick`'s order (mean less one standard error),
  while repeats hold less than ``share`` of the budget;
* the others try a neighbour of a leader not evaluated yet — one searched param one step away
  (another choice of a categorical; the next value of a stepped or integer range of up to
  ``STEPS + 1`` values, else a ``1 / STEPS`` move of its range, on the log scale for a log
  param), drawn at random among the unseen neighbours of the best leader that has one (in a
  continuous range, nearer ones, ``SCALES``, once those are seen); where no leader has one left,
  a leader is repeated instead (beyond ``share``: nothing new is near);
* the best is named by :func:`~proftune.search._reeval.pick`, as without the phase.

Why: TPE's own evaluations held better configurations than the one it named (choosing the truly
best it had evaluated would have given 0.60x its regret at 50 evaluations, 0.37x at 200), and
local moves around good configurations find more. Measured with ``benchmarks/samplers.py``
(the regret of the true mean of the pick over Optuna's TPE alone; the README's search section
has the table); offline on TPE's own trajectories, a phase of 0.4 or 0.6 of the budget, every
third evaluation a repeat, only contested repeats, or the top 5 leaders did no better.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from ._reeval import MIN_BUDGET, Group, group_key, next_repeat, pooled_noise
from ._space import Param, Space

__all__ = ["SCALES", "STEPS", "TOP", "Step", "neighbours", "next_step", "refining"]

#: Leaders whose repeats and neighbours the phase tries.
TOP = 3
#: Moves across a continuous range (or a stepped one with more values): a neighbour is 1/STEPS away.
STEPS = 10
#: Where a leader's neighbours are all seen, nearer ones: 1/(STEPS x scale) of a continuous range.
SCALES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Step:
    """What the search evaluates next: ``"repeat"`` (a leader again) or ``"neighbour"`` (a new
    configuration next to a leader), its params, and the leader's evaluations so far."""

    kind: str
    params: dict[str, object]
    n: int


def _position(p: Param, value: float) -> float:
    assert p.low is not None
    assert p.high is not None
    if p.log:
        return (math.log(value) - math.log(p.low)) / (math.log(p.high) - math.log(p.low))
    return (value - p.low) / (p.high - p.low)


def _at(p: Param, u: float) -> Any:
    assert p.low is not None
    assert p.high is not None
    if p.log:
        return p.snap(math.exp(math.log(p.low) + u * (math.log(p.high) - math.log(p.low))))
    return p.snap(p.low + u * (p.high - p.low))


def _moves(p: Param, value: Any, scale: int = 1) -> list[Any]:
    """The values one step from ``value`` (a continuous step ``1 / (STEPS x scale)`` of the range)."""
    if p.type == "categorical":
        return [c for c in p.choices if c != value]
    assert p.low is not None
    assert p.high is not None
    if p.high <= p.low:
        return []
    if p.step or p.type == "int":
        step = p.step or 1
        count = math.floor((p.high - p.low) / step + 1e-9) + 1
        if count <= STEPS + 1 and not p.log:
            out = [p.snap(float(value) + d * step) for d in (-1, 1)]
            return [v for v in dict.fromkeys(out) if v != value]
    u = _position(p, float(value))
    out = [_at(p, min(max(u + d / (STEPS * scale), 0.0), 1.0)) for d in (-1, 1)]
    return [v for v in dict.fromkeys(out) if v != value]


def _completed(space: Space, values: dict[str, object]) -> dict[str, object]:
    """``values`` with the params a change switched on (at their centre) or off (dropped)."""
    for _ in range(len(space.params)):
        changed = False
        for p in space.params:
            on = p.active({**space.fixed, **values})
            if on and p.name not in values:
                values[p.name], changed = p.center(), True
            elif not on and p.name in values:
                del values[p.name]
                changed = True
        if not changed:
            break
    return values


def neighbours(params: Mapping[str, object], space: Space, scale: int = 1) -> list[dict[str, object]]:
    """Every configuration one searched param one step from ``params`` (the searched params
    only; forbidden ones left out); ``scale`` divides the step of a continuous range."""
    names = set(space.names)
    base = {k: v for k, v in params.items() if k in names}
    out: list[dict[str, object]] = []
    for p in space.params:
        if p.name not in base:
            continue
        for v in _moves(p, base[p.name], scale):
            near = _completed(space, {**base, p.name: v})
            if space.forbidden({**space.fixed, **near}) is None:
                out.append(near)
    return out


def refining(evaluations: int, *, share: float, budget: int | None) -> bool:
    """Whether the evaluation after ``evaluations`` falls in the refining phase."""
    if budget is None or budget < MIN_BUDGET or share <= 0:
        return False
    return evaluations >= budget - math.floor(2 * share * budget)


def next_step(gs: Sequence[Group], space: Space, *, maximize: bool, repeats: int, evaluations: int,
              share: float, budget: int | None, seed: int = 0, seen: AbstractSet[str] | None = None) -> Step | None:
    """The repeat or neighbour to evaluate now, or None to let the sampler draw: before the phase;
    in it, where no leader has an unseen neighbour and no repeat is allowed. Without a ``budget``
    repeats are interleaved with exploring (:func:`~proftune.search._reeval.next_repeat`).
    ``seen``: the group keys of ``gs``'s params among the space's names, where the caller keeps
    them (:meth:`~proftune.search._reeval.GroupTable.seen`); computed here otherwise."""
    if not gs:
        return None
    if budget is None:
        again = next_repeat(gs, maximize=maximize, repeats=repeats, evaluations=evaluations, share=share)
        return None if again is None else Step("repeat", again, next(g.n for g in gs if g.params == again))
    if not refining(evaluations, share=share, budget=budget):
        return None
    noise = pooled_noise(gs)
    sign = 1.0 if maximize else -1.0

    def lower(g: Group) -> float:  # pick's order: the mean less its interval, in the better direction
        return sign * g.mean - (noise / math.sqrt(g.n) if noise is not None else 0.0)

    leaders = heapq.nlargest(TOP, gs, key=lower)  # sorted(..., reverse=True)[:TOP], in one pass
    start = budget - math.floor(2 * share * budget)
    repeat_ok = repeats + 1 <= share * budget
    if repeat_ok and (evaluations - start) % 2 == 1:
        g = min(leaders, key=lambda x: x.n)
        return Step("repeat", dict(g.params), g.n)
    if seen is None:
        names = set(space.names)
        seen = {group_key({k: v for k, v in g.params.items() if k in names}) for g in gs}
    rng = random.Random(seed * 1_000_003 + evaluations)
    for g in leaders:
        for scale in SCALES:  # a continuous range's nearer neighbours once the farther ones are seen
            fresh = [p for p in neighbours(g.params, space, scale) if group_key(p) not in seen]
            if fresh:
                return Step("neighbour", rng.choice(fresh), g.n)
    g = min(leaders, key=lambda x: x.n)  # nothing new next to the leaders: tell them apart instead
    return Step("repeat", dict(g.params), g.n)
