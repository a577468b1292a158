"""The search stage: warm start at the computed values and the defaults, then TPE (Optuna's
multivariate TPE, constant liar) fed every trial so far, with successive halving on epochs;
yellow flags pause regions where trials fail for one cause; auto-stop scales with the trials run.

Trials run through ``proftune.search`` (the profile gate, the fit loop, the Store and the Optuna
study are its own): this module chooses each chunk of configurations, hands them to ``search``
as ``enqueue`` items, and reads the trials back from the :class:`~proftune.search.SearchResult`.
Everything it decides is a function of the study's trials, so a killed search resumes by
calling it again.
"""

from __future__ import annotations

import math
import re
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._jsonsafe import finite_float
from ..search import EnqueuedTrial, SearchResult, TrialRecord, cancel_waiting, search, study_trials
from ..task import Task
from ..track import RunRecord, Store
from ._computed import OptimizerChoice
from ._decide import pooled_seed_std
from ._search_plan import SearchPlan
from ._search_records import Bound, ConfigGroup, TrialLog, YellowFlag, arm_of, enqueued
from ._warm_start import by_success, space_point, warm_start

__all__ = ["ConfigGroup", "SearchOutcome", "StageSettings", "TrialLog", "YellowFlag", "find_flags", "groups_of",
           "run_search_stage"]

#: The arms: warm-start points (computed centre, the task's defaults, a local design around the
#: centre, quasi-random points over the whole space), then TPE proposals.
ARMS = ("centre", "defaults", "local", "wide", "tpe")
#: The successive-halving pruner's rungs grow by this factor (epochs 1, 3, 9, ...).
REDUCTION_FACTOR = 3
#: Seconds a call of ``search`` is assumed to cost beyond its trials before one is measured.
CALL_OVERHEAD_S = 0.3
#: The most trials one call of ``search`` runs (a chunk).
CHUNK_MAX = 20
#: Share of the search's time after which a flat search may stop itself.
STALL_AFTER = 0.75
#: The models of this many of the best complete trials are kept across the stage's chunks (``keep_models``).
KEPT_MODELS = 3
#: The last share of the search's time re-evaluates its leaders at new seeds: among hundreds of
#: single draws on a small or noisy validation set the best draw is the luckiest (the winner's
#: curse), and the race's challengers are named by the mean that held up on repeats.
REEVAL_SHARE = 0.2
#: Leaders re-evaluated (by the shrunk order of :func:`groups_of`), evaluations each at most, and
#: complete trials before the phase starts (a few draws have little curse to undo).
REEVAL_TOP = 4
REEVAL_N = 3
REEVAL_MIN_TRIALS = 12
#: Standard errors taken off a mean in the better direction to rank groups (as ``search``'s pick).
RANK_Z = 1.0


@dataclass
class StageSettings:
    """How the search stage runs (from OptimizeConfig and the stages before it)."""

    objective: str  # "accuracy:max"
    metric: str
    maximize: bool
    constraints: tuple[str, ...] = ()
    epochs: int = 1
    study: str = ""
    seed: int = 0
    device: str = "auto"
    max_trials: int = 500
    #: Auto-stop: no improvement by more than ``min_delta`` over the last
    #: ``max(patience, patience_share x trials so far)`` trials.
    patience: int = 8
    patience_share: float = 0.5
    min_delta: float = 1e-3
    flag_min: int = 3
    #: The task's defaults (their metric under the trial protocol is measured first).
    defaults: Mapping[str, object] = field(default_factory=dict)
    #: The defaults' metric at the trials' protocol measured before the search (the baseline's
    #: training, where the trials run the task's own epochs): they are not trained again as a trial.
    defaults_measured: float | None = None
    #: Successive halving on epochs (``asha``) or none.
    pruner: str = "asha"
    #: The first epoch a rung may sit at: where the defaults' own curve had separated from its start.
    first_rung: int = 1
    #: How far behind a rung's cut a trial must be before successive halving prunes it: one validation
    #: figure's sampling noise (0: the cut alone, as Optuna's pruner).
    prune_margin: float = 0.0
    #: Seconds a full trial is expected to take before any has run (epochs x the baseline's epoch).
    trial_s_estimate: float = 0.0
    #: Another optimizer (with its lr, momentum) the compute stage measured better than the task's.
    alternative: OptimizerChoice | None = None
    #: Each trial's Run as it ends (``search(on_trial=)``); None: nobody is told.
    on_trial: Callable[[RunRecord], object] | None = None
    #: A folder for the models of the leading trials (``search(keep_models=)``): the race takes the
    #: search's training of its best as that configuration's first seed; None: none kept.
    keep_models: str | None = None


@dataclass
class SearchOutcome:
    """What the search stage found and how it ended."""

    study: str
    trials: list[TrialRecord]
    best: ConfigGroup | None
    groups: list[ConfigGroup]
    flags: list[YellowFlag]
    stop_reason: str
    arms: dict[str, int]
    duration_s: float
    search_calls: int
    history: list[tuple[float, float]] = field(default_factory=list)
    #: The task's defaults under the trial protocol (their group), when they were measured.
    defaults: ConfigGroup | None = None
    #: Whether the search ended before its time was spent (auto-stop, exhausted space).
    early: bool = False


# -- reading trials -----------------------------------------------------------------------------
def trial_json(t: TrialRecord) -> dict[str, object]:
    """A trial as ``search_trials.json`` holds it (the file's keys since it was first written)."""
    return {"number": t.number, "state": t.state, "params": dict(t.params), "value": t.value,
            "reason": t.reason, "anomalies": t.anomalies, "arm": arm_of(t), "duration_s": t.duration_s,
            "metrics": t.metrics, "steps": t.steps, "gated": t.gated, "epochs": t.epochs}


def _finished(rows: Sequence[TrialRecord]) -> int:
    """Trials that ended (trained, gated or failed in user code)."""
    return sum(1 for r in rows if r.ended)


def _trained(rows: Sequence[TrialRecord]) -> int:
    """What ``search(trials=...)`` counts: trained trials (gated ones apart)."""
    return sum(1 for r in rows if (r.state in ("complete", "pruned", "infeasible") and not r.gated)
               or (r.state == "failed" and bool(r.reason)))


# -- yellow flags -----------------------------------------------------------------------------
def _cause(row: TrialRecord) -> str | None:
    reason = str(row.reason or "")
    kinds = {a.get("kind") for a in row.anomalies or []}
    if row.state == "pruned" and ("non-finite" in reason or kinds & {"nan_loss", "nonfinite_metric"}):
        return "nan"
    if "out of memory" in reason.lower():
        return "oom"
    if row.state == "failed" and reason:
        m = re.match(r"^([A-Za-z_][\w.]*)(?::|$)", reason)
        return f"exception:{m.group(1) if m else 'unknown'}"
    return None


def find_flags(rows: Sequence[TrialRecord], plan: SearchPlan, *, flag_min: int) -> list[YellowFlag]:
    """Regions where ``flag_min`` or more trials failed for one cause and no trial succeeded.

    The region is the box the failing trials span, widened to the edge of the space on a side
    where no successful trial lies beyond it; categorical params: the values the failures took.
    """
    ok = [r for r in rows if r.state == "complete"]
    by_cause: dict[str, list[TrialRecord]] = {}
    for r in rows:
        c = _cause(r)
        if c is not None:
            by_cause.setdefault(c, []).append(r)
    flags = []
    for cause, bad in sorted(by_cause.items()):
        if len(bad) < flag_min:
            continue
        region: dict[str, Bound] = {}
        for p in plan.space.params:
            vals = [r.params[p.name] for r in bad if p.name in r.params]
            if not vals:
                continue
            if p.type == "categorical":
                region[p.name] = {"in": sorted(set(vals), key=str)}
                continue
            assert p.low is not None
            assert p.high is not None
            lo, hi = min(float(v) for v in vals), max(float(v) for v in vals)
            good = [float(r.params[p.name]) for r in ok if p.name in r.params]
            if not any(g < lo for g in good):
                lo = float(p.low)
            if not any(g > hi for g in good):
                hi = float(p.high)
            region[p.name] = {"low": lo, "high": hi}
        flag = YellowFlag(cause=cause, trials=[r.number for r in bad], region=region,
                          evidence=[f"trial {r.number}: {_short(r.params)} -> {r.reason}" for r in bad[:5]])
        if any(flag.contains(r.params) for r in ok):
            continue  # successes inside: the cause is not the region's
        flags.append(flag)
    return flags


def _short(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


# -- choosing configurations ------------------------------------------------------------------
def _mirror(rows: Sequence[TrialRecord], plan: SearchPlan, settings: StageSettings, seed: int) -> Any:
    """An in-memory Optuna study holding every finished trial, sampled by multivariate TPE."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True,
                                             n_startup_trials=5, warn_independent_sampling=False)
    study = optuna.create_study(direction="maximize" if settings.maximize else "minimize", sampler=sampler)
    params_by_name = {p.name: p for p in plan.space.params}
    for r in rows:
        params = {k: v for k, v in r.params.items() if k in params_by_name}
        if not params:
            continue
        dists = {k: params_by_name[k].distribution() for k in params}
        try:
            value = finite_float(r.value)
            if r.state == "complete" and value is not None:
                trial = optuna.trial.create_trial(params=params, distributions=dists, value=value)
            elif r.state in ("pruned", "infeasible"):
                last = finite_float(r.metrics.get(settings.metric))
                inter = {max(1, r.epochs): last} if last is not None else {}
                trial = optuna.trial.create_trial(params=params, distributions=dists, intermediate_values=inter,
                                                  state=optuna.trial.TrialState.PRUNED)
            else:
                continue
        except ValueError:  # a value outside the space (a user's enqueued point): not modelled
            continue
        study.add_trial(trial)
    return study


def propose(rows: Sequence[TrialRecord], plan: SearchPlan, settings: StageSettings,
            flags: Sequence[YellowFlag], n: int) -> list[EnqueuedTrial]:
    """``n`` new configurations from TPE over every finished trial, none in a paused region and
    none already tried (TPE's constant liar spreads the chunk)."""
    import optuna

    study = _mirror(rows, plan, settings, seed=settings.seed * 7919 + len(rows))
    seen = [{**plan.space.fixed, **r.params} for r in rows]
    chunk: list[EnqueuedTrial] = []
    for _ in range(n):
        for _attempt in range(30):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trial = study.ask()
                params = plan.space.suggest(trial)
            merged = {**plan.space.fixed, **params}
            if any(f.contains(merged) for f in flags) or merged in seen:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            break  # left running: the constant liar keeps the next proposals away from it
        else:
            continue
        seen.append(merged)
        chunk.append(enqueued("tpe", params))
    return chunk


# -- auto-stop, groups ------------------------------------------------------------------------
def stalled(rows: Sequence[TrialRecord], settings: StageSettings) -> str | None:
    """Why the search stops now for lack of progress, or None.

    Stopped when the best improved by less than ``min_delta`` over the last
    ``max(patience, patience_share x trials)`` trials: a patience that grows with the search, so
    that cheap trials and a long budget are not thrown away after a few flat draws.
    """
    vals = [r.value for r in sorted(rows, key=lambda r: r.number) if r.value is not None]
    k = max(settings.patience, math.ceil(settings.patience_share * len(vals)))
    if len(vals) <= k:
        return None
    sign = 1.0 if settings.maximize else -1.0
    before = max(sign * v for v in vals[:-k])
    after = max(sign * v for v in vals)
    if after - before < settings.min_delta:
        return (f"auto-stop: the best {settings.metric} improved by {after - before:.4g} (< min_delta "
                f"{settings.min_delta}) over the last {k} of {len(vals)} complete trials")
    return None


def _trial_s(rows: Sequence[TrialRecord]) -> float:
    """Median seconds of the finished trials (0 before any): what the next one will take."""
    durations = [float(r.duration_s) for r in rows if r.duration_s]
    return statistics.median(durations) if durations else 0.0


def _slow_trial_s(rows: Sequence[TrialRecord], full_s: float = 0.0) -> float:
    """What the next trial may take on a machine whose load changes: the 90th percentile of the
    last 20 finished trials' seconds, and at least what one that is not pruned takes (a trial
    started runs to its end, and it is the good ones that do: the median complete trial, else
    ``full_s``, the estimate of a trial at the stage's epochs). At 8 trainings of a noisy task
    under load, 20 of 22 trials were pruned at an epoch or two: the percentile said 0.5 s, the
    last trial ran its 14 epochs (2-3 s) past the search's end, and the race had no time left
    for one run of the leader (the defaults were kept, 5 of 5 repetitions). 0 before any."""
    durations = sorted(float(r.duration_s) for r in rows[-20:] if r.duration_s)
    if not durations:
        return 0.0
    complete = [float(r.duration_s) for r in rows if r.duration_s and r.state == "complete"]
    whole = statistics.median(complete) if complete else full_s
    return max(durations[min(len(durations) - 1, int(0.9 * len(durations)))], whole)


def _key(params: Mapping[str, Any]) -> str:
    return repr(sorted((k, round(v, 12) if isinstance(v, float) else v) for k, v in params.items()))


def _is_point(params: Mapping[str, Any], point: Mapping[str, Any]) -> bool:
    """Whether a trial's ``params`` (the space's values and the fixed ones) are at ``point``."""
    return _key({k: params.get(k) for k in point}) == _key(point)


def _defaults_point(plan: SearchPlan, settings: StageSettings) -> dict[str, object]:
    return space_point(plan, {k: v for k, v in settings.defaults.items() if k in set(plan.space.names)})


def shrunk(g: ConfigGroup, noise: float | None, maximize: bool) -> float:
    """A group's mean less ``RANK_Z`` standard errors in the better direction (higher is better):
    a configuration seen once is not named over one whose mean held up on repeats unless it is
    ahead beyond that noise."""
    sign = 1.0 if maximize else -1.0
    return sign * g.mean - (RANK_Z * noise / math.sqrt(g.n) if noise is not None else 0.0)


def groups_of(rows: Sequence[TrialRecord], maximize: bool) -> list[ConfigGroup]:
    """Complete trials grouped by configuration: mean +- std over seeds, best first by
    :func:`shrunk` (the mean itself until some configuration was evaluated twice)."""
    groups: dict[str, list[tuple[TrialRecord, float]]] = {}
    for r in rows:
        if r.value is not None:
            groups.setdefault(_key(r.params), []).append((r, float(r.value)))
    out = []
    for members in groups.values():
        vals = [v for _, v in members]
        out.append(ConfigGroup(params=dict(members[0][0].params), values=vals,
                               trials=[r.number for r, _ in members],
                               arms=[arm_of(r) for r, _ in members], mean=statistics.fmean(vals),
                               std=statistics.stdev(vals) if len(vals) > 1 else None, n=len(vals),
                               trial_s=statistics.median(float(r.duration_s or 0.0) for r, _ in members)))
    noise = pooled_seed_std((g.std, g.n) for g in out)
    out.sort(key=lambda g: -shrunk(g, noise, maximize))
    return out


def repeats_due(rows: Sequence[TrialRecord], plan: SearchPlan, settings: StageSettings,
                n: int, *, with_defaults: bool = True) -> list[EnqueuedTrial]:
    """Up to ``n`` re-evaluations (arm, params, evaluations before: ``repeat``) of the ``REEVAL_TOP`` leaders
    tried fewer than ``REEVAL_N`` times; none before ``REEVAL_MIN_TRIALS`` complete trials."""
    groups = groups_of(rows, settings.maximize)
    if sum(g.n for g in groups) < REEVAL_MIN_TRIALS:
        return []
    names = set(plan.space.names)
    tried: dict[str, int] = {}
    for r in rows:  # every attempt counts (a pruned or failed repeat is not tried again and again)
        tried[_key(r.params)] = tried.get(_key(r.params), 0) + 1
    out = []
    for g in groups[:REEVAL_TOP]:
        attempts = tried.get(_key(g.params), 0)
        if attempts < REEVAL_N:
            out.append(enqueued(g.arms[0], {k: v for k, v in g.params.items() if k in names}, attempts))
    # the defaults too: the race's power rests on their seeds' spread, which a rate too high makes
    # many times the leaders' (the baseline's training is their first evaluation where it was one)
    point = _defaults_point(plan, settings)
    attempts = sum(_is_point(r.params, point) for r in rows) + (settings.defaults_measured is not None)
    if with_defaults and settings.defaults and attempts < REEVAL_N:  # first: the race's plan reads their spread
        out.insert(0, enqueued("defaults", point, attempts))
    return out[:n]


def standing(rows: Sequence[TrialRecord], plan: SearchPlan,
             settings: StageSettings) -> tuple[ConfigGroup | None, ConfigGroup | None, float | None]:
    """The defaults' group (with the baseline's measurement), the best other group, and the seeds'
    spread pooled over every group: what the race will be planned from, as the trials stand."""
    groups = groups_of(rows, settings.maximize)
    point = _defaults_point(plan, settings)
    defaults = _with_baseline(next((g for g in groups if _is_point(g.params, point)), None), plan, settings)
    best = next((g for g in groups if not _is_point(g.params, point)), None)
    spread = pooled_seed_std((g.std, g.n) for g in [*groups, *([defaults] if defaults else [])])
    return defaults, best, spread


def _with_baseline(group: ConfigGroup | None, plan: SearchPlan, settings: StageSettings) -> ConfigGroup | None:
    """The defaults' group with the baseline's measurement of them at this protocol (where it is one)
    as its first value (arm ``baseline``)."""
    if settings.defaults_measured is None:
        return group
    v = float(settings.defaults_measured)
    if group is None:
        return ConfigGroup(params=_defaults_point(plan, settings),
                           values=[v], trials=[], arms=["baseline"], mean=v, std=None, n=1,
                           trial_s=settings.trial_s_estimate)
    values = [v, *group.values]
    return replace(group, values=values, arms=["baseline", *group.arms], mean=statistics.fmean(values),
                               std=statistics.stdev(values), n=len(values))


def _history(rows: Sequence[TrialRecord], maximize: bool) -> list[tuple[float, float]]:
    history: list[tuple[float, float]] = []
    for r in sorted(rows, key=lambda r: r.number):
        if r.value is not None:
            v = float(r.value)
            best = history[-1][1] if history else v
            history.append((float(r.number), max(best, v) if maximize else min(best, v)))
    return history


# -- the stage --------------------------------------------------------------------------------
def _call(task: Task, plan: SearchPlan, settings: StageSettings, *, store: Store, trials: int,
          timeout: float | None, items: Sequence[EnqueuedTrial]) -> SearchResult:
    """Every trial of the stage runs through this one call of ``proftune.search``: ``items``, the
    configurations it trains first, each made (and checked) where it was chosen, of the space's params."""
    pruner = settings.pruner if settings.epochs >= REDUCTION_FACTOR else "none"
    # the first rung at about a ninth of the epochs (one epoch of a short schedule says little), and
    # never before the defaults' curve separated from its start; none left below the last epoch: no pruner
    first = max(1, math.ceil(settings.epochs / REDUCTION_FACTOR**2), settings.first_rung)
    if first >= settings.epochs:
        pruner = "none"
    space = plan.space
    if pruner == "asha" and not space.pruner:
        import dataclasses

        margin = {"margin": settings.prune_margin} if settings.prune_margin else {}
        space = dataclasses.replace(space, pruner={"min_resource": first, "reduction_factor": REDUCTION_FACTOR,
                                                   **margin})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return search(task, space, objectives=[settings.objective], constraints=settings.constraints,
                      trials=trials, timeout=timeout, sampler="random", pruner=pruner,
                      epochs=settings.epochs, study=settings.study, store=store, seed=settings.seed,
                      device=settings.device, max_failures=10**6, scan=0, analyse=False,
                      on_trial=settings.on_trial, keep_models=settings.keep_models,
                      enqueue=list(items))


def _drop_kept(folder: Path, trials: Sequence[TrialRecord], maximize: bool) -> None:
    """Keep the models of the ``KEPT_MODELS`` best complete trials so far (each chunk's runner kept
    its own best: on a large model, every chunk's would fill the disk); delete the others."""
    sign = 1.0 if maximize else -1.0
    done = sorted((sign * v, t.number) for t in trials if (v := finite_float(t.value)) is not None)
    keep = {f"trial-{n}.pt" for _, n in done[::-1][:KEPT_MODELS]}
    for path in folder.glob("trial-*.pt"):
        if path.name not in keep:
            path.unlink(missing_ok=True)


def run_search_stage(task: Task, plan: SearchPlan, settings: StageSettings, *, store: Store,
                     seconds: float, on_chunk: Callable[[int, int], None] | None = None,
                     must_end: float | None = None,
                     reserve: Callable[[Sequence[TrialRecord]], float] | None = None) -> SearchOutcome:
    """Run the stage for at most ``seconds``.

    ``must_end`` (``time.monotonic()``) less ``reserve(the trials so far)`` bounds it too: the
    stages after the search need time that grows with what the trials found (the race's seeds
    follow the spread of the defaults and the leader, and the gain between them).
    """
    started = time.monotonic()
    end = started + seconds

    def bound(rows: Sequence[TrialRecord]) -> None:
        # as the trials stand, not the least of every bound so far: a reserve kept before any trial
        # (a race for a leader not yet found) is given back once the trials show none
        nonlocal end
        if must_end is None or reserve is None:
            return
        end = min(started + seconds, max(started, must_end - reserve(rows)))

    calls = 0
    stop_reason = "the search stage's share of the budget is spent"
    early = False
    rows = list(study_trials(settings.study, store=store))  # a resumed search's trials
    result: SearchResult | None = None
    flags: list[YellowFlag] = []
    # seconds a call of ``search`` costs beyond its trials (opening the study, the run record,
    # reading the trials back): measured per call, the largest kept; on a busy machine it is
    # seconds, and a call that starts too late eats the final race's reserve
    overhead = CALL_OVERHEAD_S
    while True:
        if result is not None:
            rows = list(result.trials)
        bound(rows)
        flags = find_flags(rows, plan, flag_min=settings.flag_min)
        # a flat search stops only once three quarters of its time are spent: cheap trials and a
        # long budget are worth more draws; what it leaves goes to the final race and compression
        why = stalled(rows, settings) if time.monotonic() - started >= STALL_AFTER * (end - started) else None
        # a flat search re-evaluates its leaders before it stops (the race takes its best by that mean)
        if why and not repeats_due(rows, plan, settings, 1, with_defaults=False):
            stop_reason, early = why, True
            break
        if _finished(rows) >= settings.max_trials:
            stop_reason, early = f"max_trials={settings.max_trials} reached", True
            break
        per_trial = _trial_s(rows) or settings.trial_s_estimate
        slow_trial = _slow_trial_s(rows, settings.trial_s_estimate) or per_trial
        # the time a call's trials may start in: what is left less the call's own cost and one
        # slow trial (a trial started before the call's timeout runs to its end)
        window = end - time.monotonic() - overhead - slow_trial
        if rows and window <= 0:
            break  # the next trial would not finish in time
        # a chunk of about a second of trials (at least 3): the call's own cost stays small, and the
        # plan, the auto-stop and the re-evaluations are read again between chunks (larger chunks,
        # tried in this round, let a flat search's re-evaluations run past its auto-stop on a quiet
        # machine); never more than the time left holds (a queued trial that never runs is cancelled)
        fit_in = int((window + slow_trial) / per_trial) if per_trial > 0 else 20
        size = max(1, min(int(min(CHUNK_MAX, max(3, 1.0 / max(per_trial, 1e-3)))), fit_in,
                          settings.max_trials - _finished(rows)))
        # the stage's last REEVAL_SHARE (of its time or of max_trials) re-evaluates the leaders
        # first, then explores again
        late = (bool(why) or time.monotonic() - started >= (1 - REEVAL_SHARE) * (end - started)
                or _finished(rows) >= (1 - REEVAL_SHARE) * settings.max_trials)
        again = repeats_due(rows, plan, settings, size) if late and rows else []
        chunk: list[EnqueuedTrial]
        if not rows:
            # the computed centre and one step of its local design where two trials fit; the centre
            # alone where one does (a trial started runs to its end: a second one past the window
            # took the race's time on a loaded machine, and the defaults were kept)
            first = warm_start(plan, settings.defaults, settings.alternative,
                               with_defaults=settings.defaults_measured is None, seed=settings.seed)
            chunk = list(first[:max(size, min(2, fit_in))])
        else:
            # the warm start's trials the first chunk had no room for come before TPE's (those of a
            # prior that a point over the space beat are dropped)
            warm = [] if late or why else [
                item for item in by_success(warm_start(plan, settings.defaults, settings.alternative,
                                                       with_defaults=settings.defaults_measured is None,
                                                       seed=settings.seed), rows, settings.maximize)
                if not any(_is_point(r.params, item.params) for r in rows)][:max(0, size - len(again))]
            chunk = [*again, *warm, *(propose(rows, plan, settings, flags, size - len(again) - len(warm))
                                      if len(again) + len(warm) < size and not why else [])]
        if not chunk:
            stop_reason, early = "every configuration left is in a paused region or already tried", True
            break
        before = {r.number for r in rows}
        t_call = time.monotonic()
        result = _call(task, plan, settings, store=store, trials=_trained(rows) + len(chunk),
                       timeout=max(0.05, window), items=chunk)
        trained_s = sum(float(t.duration_s or 0.0) for t in result.trials if t.number not in before)
        overhead = max(overhead, time.monotonic() - t_call - trained_s)
        calls += 1
        if settings.keep_models is not None:
            _drop_kept(Path(settings.keep_models), result.trials, settings.maximize)
        if on_chunk is not None:
            on_chunk(_finished(result.trials), len(flags))
    cancelled = cancel_waiting(settings.study, store=store, reason="queued, not run: the search's time was spent")
    rows = [r for r in rows if r.number not in set(cancelled)]
    groups = groups_of(rows, settings.maximize)
    arms: dict[str, int] = {}
    for r in rows:
        arms[arm_of(r)] = arms.get(arm_of(r), 0) + 1
    defaults = standing(rows, plan, settings)[0]
    best = groups[0] if groups else None
    return SearchOutcome(study=settings.study, trials=rows, best=best, groups=groups[:10],
                         flags=find_flags(rows, plan, flag_min=settings.flag_min), stop_reason=stop_reason,
                         arms=arms, duration_s=time.monotonic() - started, search_calls=calls,
                         history=_history(rows, settings.maximize), defaults=defaults, early=early)
