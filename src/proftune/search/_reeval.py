"""Noise-aware selection: re-evaluate the leading configurations, name the best by its mean.

A single draw of a noisy objective flatters the luckiest configuration (the winner's curse).
Within the same budget of evaluations, the search spends a share on re-evaluating leaders:

* configurations are grouped by their params; each group has a mean and a standard error,
  taken from the pooled within-group spread (``noise``) once any group has two evaluations;
* where the number of evaluations is known (``budget``), the end of it refines around the
  leaders, repeats and neighbours (:mod:`proftune.search._refine`), and a budget under
  ``MIN_BUDGET`` explores only (at 25 evaluations every repeat cost more in exploration than
  it won in selection);
* where it is not known, repeats are interleaved with exploring (:func:`next_repeat`): after
  each new evaluation, the leaders whose interval (mean +- ``Z`` standard errors) overlaps the
  leader's are the contenders; the contender with the fewest evaluations (the leader first on
  a tie) is evaluated again, unless re-evaluations already hold ``share`` of the evaluations
  made; when one leader is ahead beyond the intervals, the search explores;
* the best (``pick``) is the group whose mean, less ``Z`` standard errors in the better
  direction, is best: a configuration seen once is not named over one whose mean has held up
  on repeats unless it is ahead beyond noise.

``share`` and the phase were measured on the exhaustive tables of ``benchmarks/samplers.py``
(15 tables, regret of the true mean of the pick against Optuna's TPE alone): the figures are
in the README's "Searching any objective" section.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .._jsonsafe import json_dumps
from .._records import JsonRecord

__all__ = ["DEFAULT_SHARE", "MIN_BUDGET", "Group", "GroupTable", "Selection", "Z", "group_key", "groups",
           "next_repeat", "pick", "pooled_noise", "select"]

#: The share of a known budget that goes to repeats; as much again tries the leaders' neighbours.
DEFAULT_SHARE = 0.25
#: Standard errors on each side of a mean that make an interval.
Z = 1.0
#: Contenders considered beside the leader.
TOP = 5
#: Budgets (evaluations known in advance) under this explore only.
MIN_BUDGET = 50


def group_key(params: Mapping[str, object]) -> str:
    """One text per configuration (floats as JSON writes them)."""
    return json_dumps(dict(sorted(params.items())))


@dataclass(frozen=True)
class Group:
    """The evaluations of one configuration: params, values (the objective, as measured)."""

    params: dict[str, object]
    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    def sq(self) -> float:
        m = self.mean
        return sum((v - m) ** 2 for v in self.values)


def groups(evaluations: Sequence[tuple[Mapping[str, object], float]]) -> list[Group]:
    """The (params, value) evaluations grouped by configuration, in order of first evaluation."""
    table: dict[str, tuple[dict[str, object], list[float]]] = {}
    for params, value in evaluations:
        if value is None or not math.isfinite(value):
            continue
        table.setdefault(group_key(params), (dict(params), []))[1].append(float(value))
    return [Group(p, tuple(v)) for p, v in table.values()]


class GroupTable:
    """:func:`groups` kept up to date one evaluation at a time (a long study's worker loop asks
    for them before every trial)."""

    def __init__(self) -> None:
        self._table: dict[str, Group] = {}
        self._seen: dict[tuple[str, ...], tuple[int, set[str]]] = {}

    def add(self, params: Mapping[str, object], value: float) -> None:
        if value is None or not math.isfinite(value):
            return
        key = group_key(params)
        g = self._table.get(key)
        values = (float(value),) if g is None else (*g.values, float(value))
        self._table[key] = Group(dict(params) if g is None else g.params, values)

    def groups(self) -> list[Group]:
        """As :func:`groups` of the evaluations added."""
        return list(self._table.values())

    def seen(self, names: Sequence[str]) -> set[str]:
        """The group keys of every configuration's params among ``names`` (what ``next_step``
        takes as already seen); read-only for the caller."""
        key = tuple(names)
        done, keys = self._seen.get(key, (0, set()))
        wanted = set(names)
        groups = list(self._table.values())
        keys.update(group_key({k: v for k, v in g.params.items() if k in wanted}) for g in groups[done:])
        self._seen[key] = (len(groups), keys)
        return keys


def pooled_noise(gs: Sequence[Group]) -> float | None:
    """The objective's standard deviation within a configuration, pooled over groups with repeats."""
    dof = sum(g.n - 1 for g in gs if g.n > 1)
    if dof == 0:
        return None
    return math.sqrt(sum(g.sq() for g in gs if g.n > 1) / dof)


def _se(g: Group, noise: float) -> float:
    return noise / math.sqrt(g.n)


def _ranked(gs: Sequence[Group], maximize: bool) -> list[Group]:
    return sorted(gs, key=lambda g: -g.mean if maximize else g.mean)


def next_repeat(gs: Sequence[Group], *, maximize: bool, repeats: int, evaluations: int,
                share: float = DEFAULT_SHARE, budget: int | None = None) -> dict[str, object] | None:
    """The params to evaluate again now, or None to explore (see the module docstring).

    ``repeats`` of the ``evaluations`` made so far were repeats; another is allowed while
    ``repeats + 1 <= share * budget`` (``budget``: the evaluations planned; default: made, and
    repeats are interleaved with exploring), and with a ``budget`` only in its last ``share``
    and where it is at least ``MIN_BUDGET``.
    """
    if share <= 0 or len(gs) < 2:
        return None
    if budget is not None and (budget < MIN_BUDGET or evaluations < budget - math.floor(share * budget)):
        return None
    total = budget if budget is not None else evaluations
    if repeats + 1 > share * total or repeats + 1 > share * (evaluations + 1):
        return None
    ranked = _ranked(gs, maximize)
    leader = ranked[0]
    noise = pooled_noise(gs)
    if noise is None:  # no spread known yet: one repeat of the leader tells it
        return dict(leader.params)
    contenders = [g for g in ranked[1:TOP + 1]
                  if abs(g.mean - leader.mean) < Z * (_se(g, noise) + _se(leader, noise))]
    if not contenders:
        return None
    chosen = min([leader, *contenders], key=lambda g: g.n)
    return dict(chosen.params)


def pick(gs: Sequence[Group], *, maximize: bool) -> Group | None:
    """The best configuration by its mean: among the most-evaluated contenders, unless one seen
    fewer times is ahead of them beyond its interval."""
    if not gs:
        return None
    ranked = _ranked(gs, maximize)
    noise = pooled_noise(gs)
    if noise is None:
        return ranked[0]
    sign = 1.0 if maximize else -1.0

    def lower(g: Group) -> float:  # the mean, less its interval, in the better direction
        return sign * g.mean - Z * _se(g, noise)

    return max(ranked, key=lower)


@dataclass(frozen=True)
class Selection(JsonRecord):
    """The configuration named best by its mean: its params, the mean of its ``n`` evaluations,
    their standard error (pooled noise / sqrt(n); None before any repeat), the interval
    (mean +- 1.96 se), and how the budget was spent (evaluations, of which repeats)."""

    WHAT: ClassVar[str] = "a search selection"
    params: dict[str, Any]
    mean: float
    n: int
    se: float | None
    low: float | None
    high: float | None
    evaluations: int
    repeats: int
    share: float
    #: The within-configuration standard deviation, pooled over the repeated configurations.
    noise: float | None = None
    #: Evaluations that tried a leader's neighbour (:mod:`proftune.search._refine`).
    neighbours: int = 0


def select(evaluations: Sequence[tuple[Mapping[str, object], float]], *, maximize: bool, repeats: int,
           share: float, neighbours: int = 0) -> Selection | None:
    """The :class:`Selection` of ``evaluations`` (params, value) by :func:`pick`."""
    gs = groups(evaluations)
    best = pick(gs, maximize=maximize)
    if best is None:
        return None
    noise = pooled_noise(gs)
    se = noise / math.sqrt(best.n) if noise is not None else None
    return Selection(params=best.params, mean=best.mean, n=best.n, se=se,
                     low=best.mean - 1.96 * se if se is not None else None,
                     high=best.mean + 1.96 * se if se is not None else None,
                     evaluations=sum(g.n for g in gs), repeats=repeats, share=share, noise=noise,
                     neighbours=neighbours)
