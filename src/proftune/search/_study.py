"""The worker loop: trials of a study until it holds ``trials`` trained ones; staged search by tiers.

Every trial is also a Run (kind ``trial``, linked to its study and to the ``tune`` run).
Faults are data: out-of-memory -> infeasible, NaN/Inf -> pruned with the anomaly, an exception
in user code -> failed with its traceback; the study goes on until ``max_failures``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypedDict

import optuna
import sqlalchemy as sa
from optuna.storages import RDBStorage

from ..exceptions import RunFailedError
from ..task import load_task
from ..track import Store, redact_url
from ._constraints import Objective
from ._pruners import make_pruner
from ._records import ATTR, TrialRecord, counts, study_view, trial_records
from ._refine import next_step
from ._samplers import make_sampler
from ._settings import SearchSettings
from ._space import Space
from ._storage import narrow_pop, open_storage, reap_dead_trials, shared
from ._trial import Surplus, TrialFailed, TrialRunner

log = logging.getLogger(__name__)

__all__ = ["STARTUP", "evaluations", "raise_if_too_many_failures", "run_worker"]

#: Complete trials before the first repeat (TPE's random start-up).
STARTUP = 10


class WorkerRun(TypedDict):
    """What :func:`run_worker` did: its worker number, the trials it ran and why it stopped."""

    worker: int
    trials_run: int
    stopped: str | None


def _stage_plan(space: Space, trials: int) -> list[tuple[str, int]]:
    """(tier, trials) per stage: the budget split evenly, the remainder to the first stages."""
    k = len(space.tiers)
    base, extra = divmod(trials, k)
    return [(tier, base + (1 if i < extra else 0)) for i, tier in enumerate(space.tiers)]


def _stage_for(space: Space, trials: int, finished: int) -> str | None:
    acc = 0
    for tier, n in _stage_plan(space, trials):
        acc += n
        if finished < acc:
            return tier
    return None


def _best_params(study: optuna.Study, objectives: Sequence[Objective], stages: Sequence[str]) -> dict[str, object]:
    """The full configuration of the best feasible complete trial among ``stages``."""
    best: TrialRecord | None = None
    sign = -1.0 if objectives[0].direction == "maximize" else 1.0
    for r in study_view(study).finished:
        if r.state == "complete" and r.stage in stages and r.values:
            if best is None or sign * r.values[0] < sign * (best.values or [0.0])[0]:
                best = r
    return dict(best.params) if best else {}


def stop_reason(study: optuna.Study, settings: SearchSettings, deadline: float | None) -> str | None:
    """Why the worker loop stops now, or None to run another trial."""
    if deadline is not None and time.time() >= deadline:
        return "timeout"
    c = counts(study)
    if c["failed"] > settings.max_failures:
        return "max_failures"
    if c["trained"] >= settings.trials:
        return "trials"
    if c["trained"] + c["running"] >= settings.trials and c["waiting"] == 0:
        return "trials"
    if c["gated"] >= settings.gated_limit:
        return "max_gated"
    sampler = study.sampler
    if isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study):
        return "grid_exhausted"
    return None


def _earlier_tunes(store: Store, settings: SearchSettings) -> int:
    """Tunes of this study recorded before this one (another process's at once, or an earlier
    continuation): each gets its own sampler seed, so two tunes of one study started together do
    not draw the same configurations (a fresh study's first tune: 0, its seed as given)."""
    if settings.tune_run_id is None:
        return 0
    return sum(1 for r in store.list_runs(kind="tune", study=settings.study) if r.id < settings.tune_run_id)


def run_worker(settings: SearchSettings, worker: int = 0, deadline: float | None = None, *,
               storage: RDBStorage | None = None, store: Store | None = None,
               after_trial: Callable[[], None] | None = None) -> WorkerRun:
    """Run trials of ``settings.study`` until it holds ``settings.trials`` trained ones.

    Gated trials (ended before training) do not count, up to ``settings.gated_limit`` of them.
    Several workers (processes, machines) may run this on one study at once. ``after_trial`` is
    called after each trial has ended and is recorded; ``storage`` and ``store``: the study's
    storage and the Store of ``settings.db`` where the caller has them open (opened here otherwise).
    Returns what this worker did and why it stopped.
    """
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    task = load_task(settings.task)
    settings.task_name = settings.task_name or task.name or type(task).__name__
    store = store if store is not None else Store(settings.db)
    storage = storage or open_storage(settings.db)
    study = optuna.load_study(study_name=settings.study, storage=shared(storage),
                              sampler=make_sampler(settings, worker, earlier=_earlier_tunes(store, settings)),
                              pruner=make_pruner(settings.pruner, settings.space.pruner))
    narrow_pop(study)
    reap_dead_trials(study, store)
    store.reap_stale()
    runner = TrialRunner(settings, task, store)
    ran = 0
    while (reason := stop_reason(study, settings, deadline)) is None:
        if settings.space.tiers:
            c = counts(study)
            stage = _stage_for(settings.space, settings.trials, c["trained"] + c["running"])
            if stage is None:
                reason = "trials"
                break
            idx = settings.space.tiers.index(stage)
            runner.stage = stage
            runner.only = [p.name for p in settings.space.params if p.tier == stage]
            runner.preset = _best_params(study, settings.objectives, settings.space.tiers[:idx])
        elif settings.reevaluate > 0:
            _maybe_repeat(study, settings)
        try:
            study.optimize(runner, n_trials=1, catch=(TrialFailed, Surplus), gc_after_trial=False,
                           show_progress_bar=False)
        except Exception as exc:
            if _told_elsewhere(exc):
                # SQLite cannot lock a queued trial for one worker (Optuna's pop reads, then writes):
                # two workers took the same one, and the other told it first; its result stands
                log.debug("trial told by another worker first: %s", exc)
                ran += 1
                continue
            lost = _database_error(exc)
            if lost is None:
                raise
            raise RunFailedError(_lost_message(settings, runner.current, lost)) from exc
        ran += 1
        if after_trial is not None:
            after_trial()
    return {"worker": worker, "trials_run": ran, "stopped": reason}


def _told_elsewhere(exc: BaseException) -> bool:
    """Whether Optuna refused to tell a trial that another worker finished first (its ``ValueError``
    "Cannot tell a COMPLETE trial.", or FAIL, PRUNED)."""
    return isinstance(exc, ValueError) and str(exc).startswith("Cannot tell a ") and str(exc).endswith(" trial.")


def _database_error(exc: BaseException) -> sa.exc.DBAPIError | None:
    """The database error behind ``exc`` (Optuna may lose it: an ``UnboundLocalError`` of its
    own, raised while handling it), or None."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, sa.exc.DBAPIError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _lost_message(settings: SearchSettings, current: tuple[int, int] | None, err: sa.exc.DBAPIError) -> str:
    what = str(getattr(err, "orig", None) or err).strip().splitlines()[0][:300]
    lost = (f"trial {current[0]} ended, and its result is in its trial run {current[1]}, but the study does "
            "not hold it (the trial stays running there until a later run of the study fails it and runs "
            "its configuration again)" if current else "the trial being recorded")
    return (f"the study {settings.study!r} lost its database {redact_url(settings.db)}: {type(err).__name__}: "
            f"{what}. Lost: {lost}. Run the same command again once the database is back: the study "
            "continues where it stopped.")


def evaluations(records: Sequence[TrialRecord]) -> list[tuple[dict[str, object], float]]:
    """(params, first objective value) of every complete trial, in order."""
    return [(dict(r.params), r.values[0]) for r in records if r.state == "complete" and r.values]


def _maybe_repeat(study: optuna.Study, settings: SearchSettings) -> None:
    """Enqueue a repeat of a leading configuration, or a neighbour of one at the end of a known
    budget, when the rules of ``_reeval`` and ``_refine`` ask for one."""
    view = study_view(study)  # read incrementally: this runs before every trial of a long study
    if view.counts()["waiting"]:
        return  # a queued trial runs first
    if len(view.evaluations) < STARTUP:
        return
    gs = view.groups.groups()
    step = next_step(gs, settings.space, maximize=settings.objectives[0].direction == "maximize",
                     repeats=view.repeats, evaluations=len(view.evaluations), share=settings.reevaluate,
                     budget=settings.trials, seed=settings.seed, seen=view.groups.seen(settings.space.names))
    if step is None:
        return
    attrs = {f"{ATTR}_repeat": step.n} if step.kind == "repeat" else {f"{ATTR}_neighbour": True}
    names = set(settings.space.names)
    study.enqueue_trial({k: v for k, v in step.params.items() if k in names}, skip_if_exists=False, user_attrs=attrs)


def raise_if_too_many_failures(study: optuna.Study, max_failures: int) -> None:
    c = counts(study)
    if c["failed"] > max_failures:
        last = [r for r in trial_records(study) if r.state == "failed"][-1]
        raise RunFailedError(
            f"{c['failed']} trials failed (more than max_failures={max_failures}); the last: "
            f"trial {last.number}: {last.reason}\n{last.traceback or ''}".rstrip())
