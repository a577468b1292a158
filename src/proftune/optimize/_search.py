"""The search stage: 70% of the trials around the computed centre, 20% over the wide space,
10% re-running the best configurations with other seeds; auto-stop; yellow flags.

Trials run through ``proftune.search`` (the profile gate, the fit loop, the Store and the
Optuna study are its own); this module only chooses each trial's configuration, enqueues it
in the study, and reads the study back. Everything it decides is a function of the study's
trials, so a killed search resumes by calling it again.
"""

from __future__ import annotations

import math
import re
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..search import Param, SearchResult, search
from ..task import Task
from ..track import Store
from ._space import SearchPlan

__all__ = ["SearchOutcome", "SearchSettings", "YellowFlag", "find_flags", "run_search_stage"]

ARM_ATTR = "proftune_optimize_arm"
SEED_ATTR = "proftune_optimize_seed"
#: Shares of the search's trials (time for ``confirm``): centre, explore, confirm.
SPLIT = {"centre": 0.7, "explore": 0.2, "confirm": 0.1}


@dataclass
class SearchSettings:
    """How the search stage runs (from OptimizeConfig and the stages before it)."""

    objective: str  # "accuracy:max"
    metric: str
    maximize: bool
    constraints: tuple[str, ...] = ()
    epochs: int = 1
    study: str = ""
    seed: int = 0
    device: str = "auto"
    chunk: int = 3
    max_trials: int = 60
    patience: int = 8
    min_delta: float = 1e-3
    flag_min: int = 3
    confirm_seeds: int = 2


@dataclass
class YellowFlag:
    """Several trials failed for the same cause in one region; that region is paused."""

    cause: str
    trials: list[int]
    region: dict[str, Any]
    evidence: list[str]

    def contains(self, params: Mapping[str, Any]) -> bool:
        for name, bound in self.region.items():
            if name not in params:
                continue
            v = params[name]
            if "in" in bound:
                if v not in bound["in"]:
                    return False
            elif not (bound["low"] <= float(v) <= bound["high"]):
                return False
        return True

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "trials": self.trials, "region": self.region, "evidence": self.evidence,
                "action": "region paused: no more samples there; the search goes on elsewhere"}


@dataclass
class SearchOutcome:
    """What the search stage found and how it ended."""

    study: str
    trials: list[dict[str, Any]]
    best: dict[str, Any] | None
    groups: list[dict[str, Any]]
    flags: list[YellowFlag]
    stop_reason: str
    arms: dict[str, int]
    duration_s: float
    search_calls: int
    history: list[tuple[float, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study, "best": self.best, "groups": self.groups,
                "flags": [f.to_dict() for f in self.flags], "stop_reason": self.stop_reason,
                "arms": self.arms, "trials": self.trials, "duration_s": self.duration_s,
                "search_calls": self.search_calls}


# -- the one call into proftune.search -----------------------------------------------------------
def call_search(task: Task | str, plan: SearchPlan, settings: SearchSettings, *, trials: int,
                timeout: float | None, seed: int, sampler: str, store: Store) -> SearchResult:
    """Every trial of the stage runs through this one call (the lead may add ``scan=`` here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return search(task, plan.space, objectives=[settings.objective], constraints=settings.constraints,
                      trials=trials, timeout=timeout, sampler=sampler, pruner="none",
                      epochs=settings.epochs, study=settings.study, store=store, seed=seed,
                      device=settings.device, max_failures=10**6)


# -- reading the study ------------------------------------------------------------------------
_STORAGES: dict[str, Any] = {}


def _load(store: Store, name: str) -> Any:
    """The study, or None before it exists; one RDB storage per database (opening one checks the
    schema, seconds on a busy machine)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = _STORAGES.get(store.url)
    if storage is None:
        storage = _STORAGES[store.url] = optuna.storages.RDBStorage(
            store.url, engine_kwargs={"connect_args": {"timeout": 60}} if store.is_sqlite else {})
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def _rows(study: Any) -> list[dict[str, Any]]:
    """Every trial with its state, params, value, arm and seed (proftune's record where present)."""
    out = []
    for t in study.get_trials(deepcopy=False):
        rec = t.user_attrs.get("proftune") or {}
        if t.user_attrs.get("proftune_surplus"):
            continue
        state = rec.get("state") or {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed",
                                     "RUNNING": "running", "WAITING": "waiting"}.get(t.state.name, "failed")
        if t.state.name in ("RUNNING", "WAITING"):
            state = t.state.name.lower()
        params = rec.get("params") or dict(t.params)
        value = t.values[0] if (t.values and state == "complete") else None
        out.append({"number": t.number, "state": state, "params": params, "value": value,
                    "reason": rec.get("reason"), "anomalies": rec.get("anomalies") or [],
                    "arm": t.user_attrs.get(ARM_ATTR, "explore"), "seed": int(t.user_attrs.get(SEED_ATTR, 0)),
                    "duration_s": rec.get("duration_s"), "metrics": rec.get("metrics") or {}})
    return out


def _finished(rows: Sequence[dict[str, Any]]) -> int:
    return sum(1 for r in rows if r["state"] in ("complete", "pruned", "infeasible")
               or (r["state"] == "failed" and r["reason"]))


# -- yellow flags -----------------------------------------------------------------------------
def _cause(row: Mapping[str, Any]) -> str | None:
    reason = str(row.get("reason") or "")
    kinds = {a.get("kind") for a in row.get("anomalies") or []}
    if row["state"] == "pruned" and ("non-finite" in reason or kinds & {"nan_loss", "nonfinite_metric"}):
        return "nan"
    if "out of memory" in reason.lower():
        return "oom"
    if row["state"] == "failed" and reason:
        m = re.match(r"^([A-Za-z_][\w.]*)(?::|$)", reason)
        return f"exception:{m.group(1) if m else 'unknown'}"
    return None


def _coord(p: Param, v: Any) -> float:
    return math.log(float(v)) if p.log and float(v) > 0 else float(v)


def find_flags(rows: Sequence[Mapping[str, Any]], plan: SearchPlan, *, flag_min: int) -> list[YellowFlag]:
    """Regions where ``flag_min`` or more trials failed for one cause and no trial succeeded.

    The region is the box the failing trials span, widened to the edge of the space on a side
    where no successful trial lies beyond it; categorical params: the values the failures took.
    """
    ok = [r for r in rows if r["state"] == "complete"]
    by_cause: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        c = _cause(r)
        if c is not None:
            by_cause.setdefault(c, []).append(r)
    flags = []
    for cause, bad in sorted(by_cause.items()):
        if len(bad) < flag_min:
            continue
        region: dict[str, Any] = {}
        for p in plan.space.params:
            vals = [r["params"][p.name] for r in bad if p.name in r["params"]]
            if not vals:
                continue
            if p.type == "categorical":
                region[p.name] = {"in": sorted(set(vals), key=str)}
                continue
            assert p.low is not None
            assert p.high is not None
            lo, hi = min(float(v) for v in vals), max(float(v) for v in vals)
            good = [float(r["params"][p.name]) for r in ok if p.name in r["params"]]
            if not any(g < lo for g in good):
                lo = float(p.low)
            if not any(g > hi for g in good):
                hi = float(p.high)
            region[p.name] = {"low": lo, "high": hi}
        flag = YellowFlag(cause=cause, trials=[int(r["number"]) for r in bad], region=region, evidence=[])
        if any(flag.contains(r["params"]) for r in ok):
            continue  # successes inside: the cause is not the region's
        flag.evidence = [f"trial {r['number']}: {_short(r['params'])} -> {r['reason']}" for r in bad[:5]]
        flags.append(flag)
    return flags


def _short(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


# -- choosing configurations ------------------------------------------------------------------
def _sample_param(p: Param, rng: np.random.Generator, bound: Any) -> Any:
    if p.type == "categorical":
        choices = list(bound) if isinstance(bound, list) and bound else list(p.choices)
        return choices[int(rng.integers(len(choices)))]
    lo, hi = (bound if bound is not None else (p.low, p.high))
    assert lo is not None
    assert hi is not None
    if p.log and lo > 0:
        v = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    else:
        v = rng.uniform(lo, hi)
    return p.snap(v)


def _perturb(p: Param, rng: np.random.Generator, around: Any, bound: Any) -> Any:
    if p.type == "categorical" or around is None:
        return _sample_param(p, rng, bound)
    lo, hi = bound
    if p.log and lo > 0 and float(around) > 0:
        span = math.log(hi) - math.log(lo)
        v = math.exp(min(max(math.log(float(around)) + rng.normal(0, 0.25 * span), math.log(lo)), math.log(hi)))
    else:
        v = min(max(float(around) + rng.normal(0, 0.25 * (hi - lo)), lo), hi)
    return p.snap(v)


def _candidate(plan: SearchPlan, arm: str, rng: np.random.Generator, incumbent: Mapping[str, Any] | None,
               first_centre: bool) -> dict[str, Any]:
    values: dict[str, Any] = dict(plan.space.fixed)
    out: dict[str, Any] = {}
    local = incumbent is not None and rng.random() < 0.5
    for p in plan.space.params:
        if not p.active(values):
            continue
        if arm == "centre" and first_centre:
            v = plan.centre.get(p.name, p.center())
        elif arm == "centre":
            bound = plan.narrow.get(p.name)
            v = _perturb(p, rng, (incumbent or {}).get(p.name), bound) if local else _sample_param(p, rng, bound)
        else:
            v = _sample_param(p, rng, None)
        out[p.name] = v
        values[p.name] = v
    return out


def _next_arm(rows: Sequence[Mapping[str, Any]]) -> str:
    counts = {"centre": 0, "explore": 0}
    for r in rows:
        if r["arm"] in counts:
            counts[r["arm"]] += 1
    n = sum(counts.values()) + 1
    want_c = SPLIT["centre"] / (SPLIT["centre"] + SPLIT["explore"])
    return "centre" if counts["centre"] < want_c * n else "explore"


def _incumbent(rows: Sequence[Mapping[str, Any]], maximize: bool) -> dict[str, Any] | None:
    done = [r for r in rows if r["state"] == "complete" and r["value"] is not None]
    if not done:
        return None
    best = max(done, key=lambda r: r["value"] if maximize else -r["value"])
    return dict(best["params"])


def _plan_chunk(rows: Sequence[dict[str, Any]], plan: SearchPlan, settings: SearchSettings,
                flags: Sequence[YellowFlag]) -> list[tuple[str, dict[str, Any]]]:
    rng = np.random.default_rng([settings.seed, len(rows)])
    seen = [dict(r["params"]) for r in rows]
    chunk: list[tuple[str, dict[str, Any]]] = []
    virtual = list(rows)
    for _ in range(settings.chunk):
        arm = _next_arm(virtual)
        first = arm == "centre" and not any(r["arm"] == "centre" for r in virtual)
        for _attempt in range(50):
            cand = _candidate(plan, arm, rng, _incumbent(rows, settings.maximize), first)
            merged = {**plan.space.fixed, **cand}
            if any(f.contains(merged) for f in flags) or merged in seen:
                first = False
                continue
            break
        else:
            continue
        seen.append(merged)
        chunk.append((arm, cand))
        virtual.append({"arm": arm, "params": cand, "state": "waiting"})
    return chunk


# -- auto-stop, groups ------------------------------------------------------------------------
def _stalled(rows: Sequence[Mapping[str, Any]], settings: SearchSettings) -> str | None:
    vals = [r["value"] for r in sorted(rows, key=lambda r: r["number"])
            if r["state"] == "complete" and r["value"] is not None and r["arm"] != "confirm"]
    k = settings.patience
    if len(vals) <= k:
        return None
    sign = 1.0 if settings.maximize else -1.0
    before = max(sign * v for v in vals[:-k])
    after = max(sign * v for v in vals)
    if after - before < settings.min_delta:
        return (f"auto-stop: the best {settings.metric} improved by {after - before:.4g} (< min_delta "
                f"{settings.min_delta}) over the last {k} trials")
    return None


def _trial_s(rows: Sequence[Mapping[str, Any]]) -> float:
    """Median seconds of the finished trials (0 before any): what the next one will take."""
    durations = [float(r["duration_s"]) for r in rows if r.get("duration_s")]
    return statistics.median(durations) if durations else 0.0


def _key(params: Mapping[str, Any]) -> str:
    return repr(sorted((k, round(v, 12) if isinstance(v, float) else v) for k, v in params.items()))


def groups_of(rows: Sequence[Mapping[str, Any]], maximize: bool) -> list[dict[str, Any]]:
    """Complete trials grouped by configuration: mean +- std over seeds, best first."""
    groups: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["state"] != "complete" or r["value"] is None:
            continue
        g = groups.setdefault(_key(r["params"]), {"params": dict(r["params"]), "values": [], "trials": [],
                                                  "seeds": []})
        g["values"].append(float(r["value"]))
        g.setdefault("durations", []).append(float(r.get("duration_s") or 0.0))
        g["trials"].append(int(r["number"]))
        g["seeds"].append(int(r["seed"]))
    out = []
    for g in groups.values():
        vals = g["values"]
        g["mean"] = statistics.fmean(vals)
        g["std"] = statistics.stdev(vals) if len(vals) > 1 else None
        g["n"] = len(vals)
        g["trial_s"] = statistics.median(g.pop("durations"))
        out.append(g)
    out.sort(key=lambda g: -g["mean"] if maximize else g["mean"])
    return out


def _choose(groups: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    confirmed = [g for g in groups if g["n"] > 1]
    pool = confirmed or list(groups)
    return pool[0] if pool else None


# -- the stage --------------------------------------------------------------------------------
def _enqueue(store: Store, plan: SearchPlan, settings: SearchSettings, items: Sequence[tuple[str, dict[str, Any]]],
             seed: int) -> None:
    study = _load(store, settings.study)
    assert study is not None
    names = set(plan.space.names)
    for arm, params in items:
        study.enqueue_trial({k: v for k, v in params.items() if k in names}, user_attrs={ARM_ATTR: arm, SEED_ATTR: seed}, skip_if_exists=False)


def run_search_stage(task: Task, plan: SearchPlan, settings: SearchSettings, *, store: Store,  # noqa: C901
                     seconds: float, on_chunk: Callable[[dict[str, Any]], None] | None = None,
                     must_end: float | None = None,
                     reserve: Callable[[float], float] | None = None) -> SearchOutcome:
    """Run the stage for at most ``seconds`` (the confirm share kept back for re-runs).

    ``must_end`` (``time.monotonic()``) less ``reserve(seconds per trial)`` bounds it too: the
    stages after the search need time that grows with what a trial of the chosen kind costs.
    """
    started = time.monotonic()
    end = started + seconds
    explore_end = started + seconds * (1.0 - SPLIT["confirm"])

    def bound(rows: Sequence[dict[str, Any]]) -> None:
        nonlocal end, explore_end
        if must_end is None or reserve is None:
            return
        limit = must_end - reserve(_trial_s(rows))
        if limit < end:
            end = max(started, limit)
            explore_end = started + (end - started) * (1.0 - SPLIT["confirm"])

    calls = 0
    stop_reason = "time budget of the search stage spent"
    history: list[tuple[float, float]] = []

    def rows_now() -> list[dict[str, Any]]:
        study = _load(store, settings.study)
        return _rows(study) if study is not None else []

    rows = rows_now()
    if not rows:
        # the study is created by proftune.search itself: its first trial is a random one
        call_search(task, plan, settings, trials=1, timeout=None, seed=settings.seed, sampler="random",
                    store=store)
        calls += 1
        rows = rows_now()
    flags: list[YellowFlag] = []
    while True:
        bound(rows)
        flags = find_flags(rows, plan, flag_min=settings.flag_min)
        stalled = _stalled(rows, settings)
        if stalled:
            stop_reason = stalled
            break
        if _finished(rows) >= settings.max_trials:
            stop_reason = f"max_trials={settings.max_trials} reached"
            break
        per_trial = _trial_s(rows)
        if time.monotonic() + per_trial >= explore_end:
            break  # the next trial would not finish in time
        waiting = sum(1 for r in rows if r["state"] == "waiting")
        chunk = [] if waiting else _plan_chunk(rows, plan, settings, flags)
        if not chunk and not waiting:
            stop_reason = "every configuration left is in a paused region or already tried"
            break
        if chunk:
            _enqueue(store, plan, settings, chunk, settings.seed)
        call_search(task, plan, settings, trials=_finished(rows) + len(chunk) + waiting,
                    timeout=max(1.0, explore_end - time.monotonic() - per_trial), seed=settings.seed,
                    sampler="random",
                    store=store)
        calls += 1
        rows = rows_now()
        if on_chunk is not None:
            on_chunk({"finished": _finished(rows), "flags": len(flags)})
    # confirm: the best configurations again with other seeds (mean +- std, not one lucky seed)
    bound(rows)
    confirm_reason = _confirm(task, plan, settings, store=store, end=end, rows=rows)
    calls += confirm_reason[1]
    rows = rows_now()
    for r in sorted(rows, key=lambda r: r["number"]):
        if r["state"] == "complete" and r["value"] is not None and r["arm"] != "confirm":
            best = max((h[1] for h in history), default=None)
            v = float(r["value"])
            history.append((float(r["number"]), v if best is None else (max(best, v) if settings.maximize else min(best, v))))
    groups = groups_of(rows, settings.maximize)
    arms: dict[str, int] = {}
    for r in rows:
        arms[r["arm"]] = arms.get(r["arm"], 0) + 1
    return SearchOutcome(study=settings.study, trials=rows, best=_choose(groups), groups=groups[:10],
                         flags=find_flags(rows, plan, flag_min=settings.flag_min),
                         stop_reason=stop_reason + confirm_reason[0], arms=arms,
                         duration_s=time.monotonic() - started, search_calls=calls, history=history)


def _confirm(task: Task, plan: SearchPlan, settings: SearchSettings, *, store: Store, end: float,
             rows: Sequence[dict[str, Any]]) -> tuple[str, int]:
    calls = 0
    done_seeds = {(_key(r["params"]), r["seed"]) for r in rows if r["arm"] == "confirm"}
    top = [g for g in groups_of(rows, settings.maximize)[:2]]
    if not top:
        return "", 0
    per_trial = _trial_s(rows)
    for s in range(1, settings.confirm_seeds + 1):
        seed = settings.seed + s
        todo = [("confirm", dict(g["params"])) for g in top if (_key(g["params"]), seed) not in done_seeds]
        if not todo:
            continue
        room = end - time.monotonic()
        n_fit = int(room // max(per_trial, 1e-3)) if per_trial > 0 else len(todo)
        todo = todo[:n_fit]
        if not todo:
            return "; confirmation runs cut short by the budget", calls
        _enqueue(store, plan, settings, todo, seed)
        study = _load(store, settings.study)
        finished = _finished(_rows(study)) if study is not None else 0
        call_search(task, plan, settings, trials=finished + len(todo), timeout=max(1.0, end - time.monotonic()),
                    seed=seed, sampler="random", store=store)
        calls += 1
    return "", calls

