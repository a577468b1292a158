"""The search's first trials, placed before any model of the space: the computed centre, the task's
defaults, a local design around the centre and quasi-random points over the whole space."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from .._jsonsafe import finite_float
from ..search import EnqueuedTrial, TrialRecord
from ._computed import OptimizerChoice
from ._search_plan import SearchPlan, in_space
from ._search_records import arm_of, enqueued

__all__ = ["WIDE_POINTS", "by_success", "halton", "space_point", "warm_start", "wide_points"]

#: Quasi-random points over the whole space in the warm start, one after each local step: where the
#: centre is wrong, or the mistake is in a param nothing measured (a dropout of 0.7), the local
#: design around it cannot see it. On 12 generated tasks at 8 trainings (seed 9300) the one-step
#: design lost 4-19 points to a plain loop's random start on an over-regularised CNN, a plateau MLP
#: and a rate 66x too high.
WIDE_POINTS = 4
#: The bases of :func:`halton`'s dimensions (a search space has a handful of params).
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71)


def space_point(plan: SearchPlan, values: Mapping[str, Any]) -> dict[str, Any]:
    """A configuration of the space's active params from ``values`` (the centre where absent)."""
    chosen: dict[str, object] = dict(plan.space.fixed)
    out: dict[str, Any] = {}
    for p in plan.space.params:
        if not p.active(chosen):
            continue
        v = values.get(p.name, plan.centre.get(p.name, p.center()))
        out[p.name] = chosen[p.name] = in_space(p, v)
    return out


def halton(n: int, d: int, seed: int) -> list[list[float]]:
    """``n`` points in [0, 1)^d of a scrambled Halton sequence: dimension j in the j-th prime base,
    its digits permuted at random (0 kept, so the tail of zeros adds nothing) and the sequence
    started at a random index, both drawn from ``seed``; dimensions past the primes listed are
    uniform draws. Not scipy's ``qmc.Halton``: importing ``scipy.stats`` took 1-5 s of a budget
    whose trainings take a second (a plain Optuna loop imports none of it)."""
    rng = random.Random(seed)
    perms = []
    for base in _PRIMES[:d]:
        rest = list(range(1, base))
        rng.shuffle(rest)
        perms.append((base, [0, *rest]))
    start = rng.randrange(1, 1 << 12)
    out = []
    for i in range(start, start + n):
        row = []
        for base, perm in perms:
            x, scale, k = 0.0, 1.0 / base, i
            while k:
                k, digit = divmod(k, base)
                x += perm[digit] * scale
                scale /= base
            row.append(x)
        out.append([*row, *(rng.random() for _ in range(d - len(perms)))])
    return out


def wide_points(plan: SearchPlan, n: int, seed: int) -> list[dict[str, object]]:
    """``n`` points of a scrambled Halton sequence over the whole space (each param on its own
    scale: log where it is log), as a plain loop's random start draws them, but spread evenly."""
    params = list(plan.space.params)
    if n <= 0 or not params:
        return []
    draws = halton(n, len(params), seed)
    out = []
    for row in draws:
        values: dict[str, object] = {}
        for p, u in zip(params, row, strict=True):
            if p.type == "categorical":
                values[p.name] = p.choices[min(int(u * len(p.choices)), len(p.choices) - 1)]
            elif p.low is not None and p.high is not None:
                if p.log and p.low > 0:
                    values[p.name] = math.exp(math.log(p.low) + u * (math.log(p.high) - math.log(p.low)))
                else:
                    values[p.name] = p.low + u * (p.high - p.low)
        out.append(space_point(plan, values))
    return out


def warm_start(plan: SearchPlan, defaults: Mapping[str, object], alternative: OptimizerChoice | None = None, *,
               with_defaults: bool = True, seed: int = 0) -> list[EnqueuedTrial]:
    """The first trials: the computed centre, the task's defaults (measured under the trial
    protocol, the bar every other trial is read against), and a local design around the centre
    (lr x3 and /3, half the batch, a hundredth of a weight decay nothing measured): what the
    measurements say before any model of the space, each local step followed by a point over the
    whole space (:func:`wide_points`, ``WIDE_POINTS`` of them): a wrong centre costs every other
    trial, not every trial; ``alternative``: another optimizer the optimizer row measured better,
    at its own rate."""
    centre = space_point(plan, plan.centre)
    names = set(plan.space.names)
    own = space_point(plan, {k: v for k, v in defaults.items() if k in names})
    # a centre that is the defaults, already measured at this protocol (the baseline), is not trained
    # again: at 8 trainings that second training of the defaults was one of the search's 5-6 trials
    items: list[tuple[str, dict[str, object]]] = [] if centre == own and not with_defaults else [("centre", centre)]
    if with_defaults:  # (not where they were measured at this protocol already)
        items.append(("defaults", own))
    if "lr" in names and "lr" in centre:
        for factor in (3.0, 1 / 3.0):
            items.append(("local", space_point(plan, {**centre, "lr": float(centre["lr"]) * factor})))
    if "batch_size" in names and "batch_size" in centre:
        items.append(("local", space_point(plan, {**centre, "batch_size": int(centre["batch_size"]) // 2})))
    wd = centre.get("weight_decay")
    if (isinstance(wd, (int, float)) and wd >= 1e-4
            and not str(plan.evidence.get("weight_decay", "")).startswith("computed")):
        # the decay is the task's or the optimizer's default, not a measurement: on Adam it is
        # L2 in the gradient, and 0.01 of it cost the plateau-start CNN two points held-out that a
        # plain Optuna loop found at ~1e-6 (the centre's other trials all hold it)
        items.append(("local", space_point(plan, {**centre, "weight_decay": float(wd) / 100})))
    if alternative is not None:
        other = {k: v for k, v in alternative.params().items() if k in names}
        items.insert(1, ("centre", space_point(plan, {**centre, **other})))
    head = [item for item in items if item[0] != "local"]
    local = [item for item in items if item[0] == "local"]
    wide = [("wide", p) for p in wide_points(plan, WIDE_POINTS, seed)]
    # a centre that is the task's own defaults is no measurement: the baseline scored it already, and
    # steps of 3x around it cannot reach a mistake of 30x. A point over the space comes first then
    first, second = (wide, local) if centre == own else (local, wide)
    items = [*head, *(x for pair in zip(first, second, strict=False) for x in pair),
             *first[len(second):], *second[len(first):]]
    out: list[EnqueuedTrial] = []
    for arm, params in items:
        if all(params != seen.params for seen in out):
            out.append(enqueued(arm, params))
    return out


def by_success(items: Sequence[EnqueuedTrial], rows: Sequence[TrialRecord], maximize: bool) -> list[EnqueuedTrial]:
    """The warm start's ``items`` that ``rows`` (the trials so far) have not placed yet, as their
    kinds scored on the task so far (PriorBand's weighting of a prior by its measured success, at one
    fidelity): the prior's (the centre and the local steps around it) and the points over the whole
    space. Where a point over the space beat every trial of the prior, the prior is wrong: its
    remaining steps are dropped, and the search's model of the space takes over after the points."""
    placed: dict[str, int] = {}
    best: dict[str, float] = {}
    sign = 1.0 if maximize else -1.0
    for r in rows:
        arm = arm_of(r)
        if r.repeat == 0:
            placed[arm] = placed.get(arm, 0) + 1
        value = finite_float(r.value)
        if r.state == "complete" and value is not None and arm in ("centre", "local", "wide"):
            kind = "wide" if arm == "wide" else "prior"
            best[kind] = max(best.get(kind, -math.inf), sign * value)
    seen: dict[str, int] = {}
    left = []
    for item in items:  # each arm's items are placed in their order: the first ones of each are done
        arm = arm_of(item)
        seen[arm] = seen.get(arm, 0) + 1
        if seen[arm] > placed.get(arm, 0):
            left.append(item)
    if "wide" in best and best["wide"] > best.get("prior", -math.inf):
        return [item for item in left if arm_of(item) == "wide"]
    return left
