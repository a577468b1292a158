"""``proftune.search(...)``: a constraint-aware, profile-gated hyperparameter search, recorded."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage

from .._deprecated import warn_experimental
from .._jsonsafe import json_safe
from ..exceptions import ConfigError, ProblemCollector, RunFailedError
from ..metrics import default_objective
from ..task import ClassificationTask, Task, absolute_spec, load_task
from ..track import Store, StudyLock, environment, open_store, redact_url, tracked_run
from ._analysis import correlations, importance, pareto_front, plot_study, study_direction
from ._backends import SEARCH_BACKEND_REGISTRY, SEARCH_BACKENDS
from ._config import EnqueuedTrial, SearchConfig, enqueued_trials, search_config
from ._constraints import PROFILE_METRICS, Constraint, Objective, parse_constraint, parse_targets
from ._feed import TrialFeed, notify_ended
from ._objective import VALUE, ObjectiveTask, is_objective
from ._pbt import pbt_plot
from ._pruners import PRUNERS, pruner_name
from ._records import ATTR, TrialRecord, counts, trial_records
from ._reeval import DEFAULT_SHARE, select
from ._result_records import SearchResult, TrialTally
from ._samplers import SAMPLERS, sampler_name
from ._scan import ScanResult, restrict_space, run_scan
from ._settings import SearchSettings, check_settings
from ._space import Space, load_space
from ._storage import enqueue_all, open_storage, shared
from ._strategy import strategy
from ._study import evaluations, raise_if_too_many_failures

__all__ = ["DEFAULT_SCAN", "SEARCH_BACKENDS", "cancel_waiting", "feasibility_scan", "search",
           "study_trials", "task_metrics"]

#: Configurations the feasibility scan profiles when there are hard profile constraints.
DEFAULT_SCAN = 16


def feasibility_scan(task: Task | str, space: str | Path | Mapping[str, Any] | Space, *, constraints: Sequence[str],
         n: int = DEFAULT_SCAN, seed: int = 0, device: str = "auto", gate_steps: int = 2) -> ScanResult:
    """Profile ``n`` Halton configurations of ``space`` (no training) and fit the bounds of the
    params within which the hard profile ``constraints`` hold (see :mod:`proftune.search._scan`)."""
    problems = ProblemCollector()
    task_obj = load_task(task)
    space_obj = load_space(space)
    _, cons = parse_targets([], constraints, task_metrics=None, problems=problems, task=task_obj)
    hard = [c for c in cons if c.is_profile]
    if not problems and not hard:
        problems.add(f"constraints={list(constraints)!r}: the scan needs a constraint on a profile metric; "
                     f"valid metrics: {', '.join(PROFILE_METRICS)}.")
    if isinstance(n, bool) or n < 1:
        problems.add(f"n must be an integer >= 1, but got {n=}.")
    problems.raise_if_any(header="feasibility_scan: the arguments are not well-formed, found the following errors:")
    return run_scan(task_obj, space_obj, hard, n=n, seed=seed, device=device, gate_steps=gate_steps)


def study_trials(study: str, *, store: Store | str | None = None, db: str | None = None) -> list[TrialRecord]:
    """Every trial of the study named ``study`` in the store's database, in our terms (complete,
    pruned, infeasible, failed, running); ``[]`` when no such study exists yet."""
    _, loaded = _load_study(study, store, db)
    return trial_records(loaded) if loaded is not None else []


def _load_study(study: str, store: Store | str | None, db: str | None) -> tuple[RDBStorage, optuna.Study | None]:
    """The store's Optuna storage and the study named ``study`` in it (None: no such study yet)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(open_store(store, db=db).url)
    try:
        return storage, optuna.load_study(study_name=study, storage=shared(storage))
    except KeyError:
        return storage, None


def cancel_waiting(study: str, *, reason: str, store: Store | str | None = None, db: str | None = None) -> list[int]:
    """End the queued trials of ``study`` that never started (enqueued, then the time ran out):
    failed with ``reason``, so that a later call does not run them; their numbers."""
    storage, loaded = _load_study(study, store, db)
    if loaded is None:
        return []
    ended = []
    for t in loaded.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
        storage.set_trial_user_attr(t._trial_id, ATTR, {"state": "failed", "reason": reason,
                                                        "params": dict(t.params)})
        storage.set_trial_user_attr(t._trial_id, f"{ATTR}_surplus", True)
        storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        ended.append(t.number)
    return ended


def task_metrics(task: Task) -> list[str] | None:
    """The metric names ``task.evaluate`` returns (None when they cannot be known)."""
    declared = getattr(task, "metrics", None)
    if isinstance(declared, (list, tuple)) and all(isinstance(m, str) for m in declared):
        return list(declared)
    evaluate = type(task).evaluate
    if evaluate is ClassificationTask.evaluate:
        return ["val_loss", "accuracy"]
    if evaluate is Task.evaluate:
        return ["val_loss"]
    try:  # the task's own evaluate: ask it once on a fresh model
        from .._device import resolve_device
        from ..train import evaluate_model

        params = dict(task.default_params)
        model = task.build_model(params)
        return sorted(evaluate_model(task, model, resolve_device("cpu"), int(params.get("batch_size", 64))))
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None  # the task's code cannot say on a fresh model; each trial reports what it returns


def _study_definition(space: Space, objectives: Sequence[Objective],
                      constraints: Sequence[Constraint], task_name: str) -> dict[str, object]:
    return {
        f"{ATTR}_space": space.to_dict(),
        f"{ATTR}_space_hash": space.hash(),
        f"{ATTR}_objectives": [o.text for o in objectives],
        f"{ATTR}_constraints": [c.text for c in constraints],
        f"{ATTR}_task": task_name,
    }


def _differences(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    out = []
    s_space, w_space = stored.get(f"{ATTR}_space") or {}, wanted[f"{ATTR}_space"]
    s_params, w_params = s_space.get("params", {}), w_space.get("params", {})
    for name in sorted(set(s_params) | set(w_params)):
        if name not in w_params:
            out.append(f"param {name!r} is in the stored space but not in this one")
        elif name not in s_params:
            out.append(f"param {name!r} is new (not in the stored space)")
        elif s_params[name] != w_params[name]:
            out.append(f"param {name!r} changed: stored {s_params[name]}, now {w_params[name]}")
    for key in ("fixed", "forbid", "tiers"):
        if s_space.get(key) != w_space.get(key):
            out.append(f"{key} changed: stored {s_space.get(key)}, now {w_space.get(key)}")
    if not out and stored.get(f"{ATTR}_space_hash") != wanted[f"{ATTR}_space_hash"]:
        out.append(f"space hash changed: stored {stored.get(f'{ATTR}_space_hash')}, now "
                   f"{wanted[f'{ATTR}_space_hash']}")
    for key, label in (("objectives", "objectives"), ("constraints", "constraints"), ("task", "task")):
        s, w = stored.get(f"{ATTR}_{key}"), wanted[f"{ATTR}_{key}"]
        if s != w:
            out.append(f"{label} changed: stored {s}, now {w}")
    return out


def search(
    task: Task | str | Callable[..., Any],
    space: str | Path | Mapping[str, Any] | Space,
    *,
    config: SearchConfig | None = None,
    store: Store | str | None = None,
    db: str | None = None,
    **options: Any,
) -> SearchResult:
    """Search ``space`` for the best configuration of ``task`` under the constraints.

    ``options`` are the fields of :class:`SearchConfig` (``objectives``, ``constraints``,
    ``trials``, ``timeout``, ``sampler``, ``pruner``, ``epochs``, ``study``, ``workers``,
    ``backend``, ``enqueue``, ...), given as keywords or as ``config``; keywords beside
    ``config`` override its fields. ``trials`` counts the study's trained trials, so running
    again with the same ``study`` continues it; profile constraints gate each trial before it
    trains. The trials and the tune Run are recorded in ``store`` (or the database ``db``).

    ``task`` may also be a plain objective: a callable from params (a dict) to metrics (a dict,
    or one number, recorded as ``value``), searched with the same samplers, constraints,
    analysis, store and report::

        def branin(p):
            x, y = p["x"], p["y"]
            return {"loss": (y - 5.1 / 39.5 * x**2 + 5 / 3.14 * x - 6) ** 2 + 10 * (1 - 1 / 25.1) * math.cos(x)}

        result = proftune.search(branin, {"params": {"x": {"type": "float", "low": -5, "high": 10},
                                                     "y": {"type": "float", "low": 0, "high": 15}}},
                                 objectives=["loss:min"], trials=50)
        result.selection.mean, result.selection.se, result.selection.n

    A plain objective is taken as noisy: a share ``reevaluate`` (0.25) of the trials re-evaluates
    the leading configurations (a ``seed`` keyword of the callable gets a new seed each time) and,
    where ``trials`` is 50 or more, as many try their neighbours, at the end of the budget; and
    ``result.selection`` names the best by its mean over its evaluations (see
    :mod:`proftune.search._reeval` and :mod:`proftune.search._refine`); for a Task the same is
    opt-in (``reevaluate=0.25``).

    ``on_trial`` (a callable of a trial's :class:`~proftune.track.RunRecord`) is called in this
    process with each trial as it ends, while the study runs: a live sink such as
    :class:`proftune.report.WandbTrialLogger`.
    """
    c = search_config(config, options)
    started = time.perf_counter()
    objective = is_objective(task)
    if objective:
        warn_experimental("proftune.search with a plain objective (a callable)", "0.1.0")
        task = ObjectiveTask(task, metrics=_objective_metrics(c))  # type: ignore[arg-type]
    task_obj = load_task(task)  # type: ignore[arg-type]
    settings, space_obj, queue = _settings(task, task_obj, space, c)  # type: ignore[arg-type]
    epochs = c.epochs
    if epochs is None and c.max_steps is None and not objective:
        settings.epochs = epochs = task_obj.default_epochs

    store = open_store(store, db=db)
    settings.db = store.url
    name = c.study or f"tune-{settings.task_name}-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{os.getpid()}"
    settings.study = name
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(store.url)
    wanted = _study_definition(space_obj, settings.objectives, settings.constraints, settings.task_name)
    stored = _stored_definition(storage, name, store.url, wanted)
    run_config = {"study": name, "space": space_obj.to_dict(), "space_hash": space_obj.hash(),
                  "objectives": [o.text for o in settings.objectives],
                  "constraints": [k.text for k in settings.constraints], "trials": c.trials, "timeout": c.timeout,
                  "sampler": sampler_name(c.sampler), "pruner": pruner_name(c.pruner), "epochs": epochs,
                  "max_steps": c.max_steps,
                  "workers": c.workers, "seed": c.seed, "device": c.device, "max_failures": c.max_failures,
                  "max_gated": c.max_gated, "scan": c.scan, "resumed": stored is not None,
                  "params": dict(space_obj.fixed)}
    with (StudyLock(store, name, command="tune", shared=True),  # tune runs share a study, optimize does not
          tracked_run("tune", task_obj, config=run_config, device=None, store=store, study=name,
                      fingerprint=not isinstance(task_obj, ObjectiveTask)) as run):
        record = store.get_run(run.id)
        settings.tune_run_id = run.id
        settings.data_fingerprint = record.data_fingerprint
        settings.env = environment(None)
        # a stored study is loaded: create_study first tries to insert it again (a failed write)
        created = (optuna.load_study(study_name=name, storage=shared(storage)) if stored is not None else
                   optuna.create_study(study_name=name, storage=shared(storage), load_if_exists=True,
                                       directions=[study_direction(o) for o in settings.objectives]))
        if stored is None:
            for key, value in wanted.items():
                created.set_user_attr(key, value)
        # ``repeat``: the evaluations of these params before this one (a new seed each)
        enqueue_all(created, [(dict(item.params), {f"{ATTR}_tags": json_safe(dict(item.tags)),
                                                   **({f"{ATTR}_repeat": item.repeat} if item.repeat else {})})
                              for item in queue])
        scan_result = _scan_for(created, stored, task_obj, space_obj, settings, c.scan)
        if scan_result is not None:
            settings.space = restrict_space(space_obj, scan_result.bounds)
        deadline = time.time() + c.timeout if c.timeout else None
        # each trial to on_trial once, as it ends; those a backend did not hand over, when it returns
        ran_with = dataclasses.replace(c, on_trial=TrialFeed(c.on_trial)) if c.on_trial is not None else c
        try:
            ran = SEARCH_BACKEND_REGISTRY.get_entry(c.backend).run(
                settings, ran_with, storage=storage, store=store, deadline=deadline,
                finished=counts(created)["trained"])
            notify_ended(ran_with, store, run.id)
            # under the backend's own registered name, also where it delegated to another
            backend = {"backend": c.backend, **{k: v for k, v in ran.details.items() if k != "backend"}}
            extra_plots = []
            schedule = backend.get("schedule")
            if c.plot is not None and isinstance(schedule, dict) and schedule and backend.get("scheduler") == "pbt":
                extra_plots.append(str(pbt_plot(schedule, Path(c.plot) / "pbt_schedule.png")))
            result = _analyse(settings, space_obj, storage, run.id, store.url, stored is not None, started,
                              scan_result, c.plot, full=c.analyse, stopped=ran.stopped,
                              backend=backend, extra_plots=extra_plots)
        except RunFailedError as exc:  # too many trials failed: the tune Run it ends, for a sink to log
            exc.run_id = exc.run_id if exc.run_id is not None else run.id
            raise
        run.set(metrics=dict(result.best.metrics) if result.best else {}, result=result.to_dict(trials=False),
                artifacts={"plots": result.plots})
    return result


def _objective_metrics(c: SearchConfig) -> list[str]:
    """The metrics a plain objective returns, as its objectives and constraints name them."""
    names = [str(o).partition(":")[0].strip() for o in (c.objectives or ())] or [VALUE]
    for text in c.constraints:
        problems = ProblemCollector()
        con = parse_constraint(text, problems)
        if con is not None and not con.is_profile:
            names.append(con.metric)
    return list(dict.fromkeys(names))


def _objective_problems(plain: bool, targets: Sequence[Objective | Constraint], metrics: Sequence[str] | None,
                        c: SearchConfig, problems: ProblemCollector) -> None:
    """What a plain objective cannot do (profile metrics, worker processes), ``reevaluate``'s range,
    and an ``on_trial`` that is not a callable."""
    if plain and any(t.is_profile for t in targets):
        problems.add("a plain objective has no model to profile; its objectives= and constraints= name "
                     f"the metrics it returns ({', '.join(metrics or [])}), not profile metrics.")
    if plain and c.workers > 1:
        problems.add(f"workers={c.workers}: a plain objective runs in this process; use workers=1.")
    if c.reevaluate is not None and (isinstance(c.reevaluate, bool) or not 0 <= c.reevaluate < 1):
        problems.add(f"reevaluate={c.reevaluate!r} must be a share of the trials in [0, 1).")
    if c.keep_models is not None and not isinstance(c.keep_models, (str, os.PathLike)):
        problems.add(f"keep_models={c.keep_models!r} must be a folder (a str or a Path), or None to keep no model.")
    if c.on_trial is not None and not callable(c.on_trial):
        problems.add(f"on_trial={c.on_trial!r} must be a callable of a trial's RunRecord (or None).")


def _settings(task: Task | str, task_obj: Task, space: Any,
              c: SearchConfig) -> tuple[SearchSettings, Space, list[EnqueuedTrial]]:
    """Validate every option of :func:`search` together; one ConfigError lists every problem.
    The ``enqueue`` items come back as records, converted here once."""
    problems = ProblemCollector()
    queue = enqueued_trials(c.enqueue, problems)
    space_obj: Space | None = None
    try:
        space_obj = load_space(space)
    except ConfigError as exc:
        problems.problems.extend(exc.problems)
    if space_obj is not None and c.params:
        searched = sorted(set(c.params) & set(space_obj.names))
        for name in searched:
            problems.add(f"{name!r} is fixed to {c.params[name]!r} by params= and also searched by the "
                         "space; keep one (a fixed value belongs in the space's fixed:).")
        if not searched:
            space_obj = dataclasses.replace(space_obj, fixed={**space_obj.fixed, **c.params})
    _enqueue_problems(queue, space_obj, problems)
    metrics = task_metrics(task_obj)
    objectives = c.objectives
    plain = isinstance(task_obj, ObjectiveTask)
    if not objectives:
        objectives = [f"{VALUE}:min"] if plain else [default_objective(metrics)]
    objs, cons = parse_targets(objectives, c.constraints, task_metrics=metrics, problems=problems,
                               task=task_obj)
    _objective_problems(plain, [*objs, *cons], metrics, c, problems)
    if not isinstance(c.sampler, optuna.samplers.BaseSampler) and c.sampler not in SAMPLERS:
        problems.add(f"sampler={c.sampler!r} is unknown; valid: {', '.join(SAMPLERS)}, or an optuna BaseSampler.")
    if not isinstance(c.pruner, optuna.pruners.BasePruner) and c.pruner not in PRUNERS:
        problems.add(f"pruner={c.pruner!r} is unknown; valid: {', '.join(PRUNERS)}, or an optuna BasePruner.")
    if c.backend not in SEARCH_BACKENDS:
        problems.add(f"backend={c.backend!r} is unknown; valid: {', '.join(SEARCH_BACKENDS)}.")
    else:
        backend_problems: list[str] = []
        SEARCH_BACKEND_REGISTRY.get_entry(c.backend).check(c, backend_problems)
        for problem in backend_problems:
            problems.add(problem)
    if c.scan is not None and (isinstance(c.scan, bool) or c.scan < 0):
        problems.add(f"scan={c.scan!r} must be an integer >= 0 (0: no scan).")
    if c.workers > 1 and not isinstance(task, str) and not _picklable(task_obj):
        problems.add("workers > 1 needs a task that other processes can load: give its spec "
                     "('file.py:Class', 'pkg.mod:Class' or a built-in name).")
    settings = None
    if space_obj is not None:
        settings = SearchSettings(
            # a file's spec made absolute now: each trial loads it again, maybe after a task that
            # changed the working folder (as Hydra does)
            task=absolute_spec(task) if isinstance(task, str) else task_obj, space=space_obj, objectives=objs,
            constraints=cons, trials=c.trials, study="", db="", sampler=c.sampler,
            pruner=c.pruner, epochs=c.epochs, max_steps=c.max_steps,
            timeout=c.timeout, seed=c.seed, device=c.device,
            max_failures=c.max_failures, max_gated=c.max_gated,
            gate_steps=c.gate_steps, workers=c.workers,
            task_name=task_obj.name or type(task_obj).__name__, coarse=c.coarse,
            grid_points=c.grid_points,
            keep_models=os.fspath(c.keep_models) if isinstance(c.keep_models, (str, os.PathLike)) else None,
            reevaluate=(DEFAULT_SHARE if plain else 0.0) if c.reevaluate is None else float(c.reevaluate))
        if settings.reevaluate and (len(objs) > 1 or space_obj.tiers):
            if c.reevaluate:
                problems.add(f"reevaluate={c.reevaluate} re-evaluates the leaders of one objective in one stage, "
                             f"but the search has {len(objs)} objectives and {len(space_obj.tiers)} tiers.")
            settings.reevaluate = 0.0
        check_settings(settings, problems)
    problems.raise_if_any(header="tune: the search is not well-formed, found the following errors:")
    assert settings is not None
    assert space_obj is not None
    return settings, space_obj, queue


def _enqueue_problems(queue: Sequence[EnqueuedTrial], space: Space | None, problems: ProblemCollector) -> None:
    """An enqueued param the space neither searches nor fixes (Optuna would drop it unsaid);
    nothing to check against where the space itself is wrong."""
    if space is None:
        return
    for i, item in enumerate(queue):
        unknown = sorted(set(item.params) - set(space.names) - set(space.fixed))
        if unknown:
            problems.add(f"enqueue[{i}] names param(s) {unknown} that the space does not hold; "
                         f"valid: {', '.join(space.names)}.")


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
    except (pickle.PicklingError, TypeError, AttributeError):
        return False
    return True


def _stored_definition(storage: Any, name: str, url: str, wanted: Mapping[str, Any]) -> dict[str, object] | None:
    """The stored study's user attrs (None: a new study); a different definition is a ConfigError."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return None
    stored = dict(storage.get_study_user_attrs(study_id))
    diffs = _differences(stored, wanted)
    if diffs:
        raise ConfigError(diffs, header=(
            f"study {name!r} in {redact_url(url)} was created with a different space or targets; "
            "it was left unchanged. Use another study= name, or the original space:"))
    return stored


def _scan_for(study: optuna.Study, stored: Mapping[str, object] | None, task: Task, space: Space,
              settings: SearchSettings, n: int | None) -> ScanResult | None:
    """The study's scan: the stored one when resuming, else a new one when asked (or by default)."""
    if stored is not None and stored.get(f"{ATTR}_scan"):
        return ScanResult.from_dict(stored[f"{ATTR}_scan"])
    hard = [c for c in settings.constraints if c.is_profile]
    count = (DEFAULT_SCAN if hard else 0) if n is None else n
    if count <= 0 or not hard or stored is not None:
        return None
    # the scan ranks configurations rather than judging one: a step fewer than the trials' gate
    result = run_scan(task, space, hard, n=count, seed=settings.seed, device=settings.device,
                      gate_steps=max(2, settings.gate_steps - 1))
    study.set_user_attr(f"{ATTR}_scan", json_safe(result.to_dict()))
    return result


def _analyse(settings: SearchSettings, space: Space, storage: Any, run_id: int, url: str, resumed: bool,
             started: float, scan_result: ScanResult | None, plot: str | Path | None, *,
             full: bool = True, stopped: str | None = None, backend: dict[str, object] | None = None,
             extra_plots: Sequence[str] = ()) -> SearchResult:
    """Read the finished study back: records, Pareto front, correlations, importance, strategy
    (the last three only when ``full``); the result, built once."""
    loaded = optuna.load_study(study_name=settings.study, storage=shared(storage))
    raise_if_too_many_failures(loaded, settings.max_failures)
    records = trial_records(loaded)
    objs, cons = settings.objectives, settings.constraints
    front = pareto_front(records, objs)
    corr = correlations(records, space, objs) if full else {}
    imp = importance(loaded, records, objs, seed=settings.seed) if full else {}
    plots = plot_study(records, objs, corr, imp, front, plot) if plot is not None and full else []
    best = front[0] if front else None
    selection = None
    if settings.reevaluate > 0 and len(objs) == 1:
        selection = select(evaluations(records), maximize=objs[0].direction == "maximize",
                           repeats=sum(1 for r in records if r.repeat), share=settings.reevaluate,
                           neighbours=sum(1 for r in records if r.sampler == "neighbour" and r.state == "complete"))
        if selection is not None:  # the best trial: the picked configuration's best draw
            same = [r for r in front if r.params == selection.params] or [
                r for r in records if r.state == "complete" and r.params == selection.params]
            best = same[0] if same else best
    return SearchResult(
        study=settings.study, run_id=run_id, db=url, objectives=objs, constraints=cons,
        trials=records, best=best, selection=selection, pareto=front, correlations=corr,
        importance=imp, space_hash=space.hash(), sampler=sampler_name(settings.sampler),
        pruner=pruner_name(settings.pruner),
        duration_s=time.perf_counter() - started, resumed=resumed, tally=TrialTally.of(records), scan=scan_result,
        strategy=strategy(records, space, objs, cons, scan=scan_result, seed=settings.seed) if full else [],
        max_gated=settings.gated_limit, stopped=stopped, backend=backend or {"backend": "local"},
        plots=[*plots, *extra_plots])


