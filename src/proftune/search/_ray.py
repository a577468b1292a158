"""Ray Tune as a second execution backend for a study: same study, same trials, same Runs.

Each trial is a Ray Tune trainable that runs proftune's trial runner (profile gate, the one fit
loop, fault classification) on a Ray worker. The sampler is Optuna's, through Ray's
``OptunaSearch`` on the study's own storage, so the space, constraints and samplers stay the
same; the driver records every trial in the Store and in the study with the same states and
fields as the local backend. Schedulers: ``fifo``, ``asha`` (Ray's successive halving on each
epoch's objective) and ``pbt`` (population-based training, synchronous and seeded: members
checkpoint model and optimizer state, the worse members continue from the better ones' and
their params move a rung along a ladder).

Fault tolerance: a trial whose worker dies is retried by Ray (``FailureConfig``); the driver
killed midway resumes the experiment from its folder (``Tuner.restore``) with the same command
(a PBT population starts again, in a folder of its own).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict

import optuna

from ..exceptions import ConfigError, RunFailedError
from ..task import absolute_spec
from ..track import Store
from ._pbt import (
    MEMBER,
    PERTURBABLE,
    ladder,
    pbt_class,
    population_class,
    population_space,
    record_population,
)
from ._ray_session import RayOptions, experiment_dir, next_folder, ray_session
from ._ray_worker import LAST_EPOCH_KEY, METRIC_KEY, ray_trainable
from ._records import ATTR, SchedulePoint, TrialFigures
from ._samplers import make_sampler
from ._settings import SearchSettings
from ._space import Space
from ._storage import reap_dead_trials
from ._trial import WORST

__all__ = ["PERTURBABLE", "RayRun", "run_ray"]

class RayRun(TypedDict, total=False):
    """What a Ray run did (``SearchResult.backend``): its scheduler and experiment folder, the
    trials it ran, Ray's retries of them, whether the experiment was resumed, and under a scheduler
    each trial's reports by its number (PBT: a member's params over epochs)."""

    backend: str
    scheduler: str
    experiment: str
    trials_run: int
    retries: int
    resumed: bool
    schedule: dict[str, list[SchedulePoint]]


# -- on the driver ------------------------------------------------------------------------------
def _searcher_class() -> type:
    from ray.tune.search.optuna import OptunaSearch

    class _StudySearch(OptunaSearch):
        """Ray's ``OptunaSearch`` on the study's storage that records trials as proftune does."""

        def __init__(self, recorder: _Recorder, **kw: Any) -> None:
            super().__init__(**kw)
            self._recorder = recorder

        def suggest(self, trial_id: str) -> dict[str, object] | None:
            config = super().suggest(trial_id)
            if config is not None:
                self._recorder.started(trial_id, self._ot_trials[trial_id].number, config)
            return config

        def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
            if result.get("proftune_done") or trial_id not in self._ot_trials:
                return
            value, epoch = result.get(METRIC_KEY), result.get("epoch")
            if value is not None and epoch is not None and not isinstance(self.metric, list):
                with contextlib.suppress(ValueError, RuntimeError):
                    self._ot_trials[trial_id].report(float(value), step=int(epoch))

        def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                              error: bool = False) -> None:
            if trial_id in self._completed_trials or trial_id not in self._ot_trials:
                return
            ot_trial = self._ot_trials[trial_id]
            if _finished_in_study(ot_trial):
                # a resumed experiment re-ran a trial the study already holds as finished (Ray
                # saves its state every few seconds; the driver died in between): that record stands
                self._completed_trials.add(trial_id)
                return
            state, values, rec = self._recorder.finished(trial_id, result, error)
            for key, v in rec.constraints_raw.items():
                ot_trial.set_constraint(key, float(v))
            for key, value in rec.user_attrs_raw.items():  # gated, failed flags
                ot_trial.set_user_attr(key, value)
            ot_trial.set_user_attr(ATTR, rec.to_dict())
            if state == "failed":
                ot_trial.set_user_attr(f"{ATTR}_failed", True)
            tell_state = {"complete": optuna.trial.TrialState.COMPLETE,
                          "infeasible": optuna.trial.TrialState.COMPLETE,
                          "pruned": optuna.trial.TrialState.PRUNED}.get(state, optuna.trial.TrialState.FAIL)
            study: Any = self._ot_study
            with contextlib.suppress(ValueError, RuntimeError):
                study.tell(ot_trial, values if tell_state == optuna.trial.TrialState.COMPLETE else None,
                                    state=tell_state)
            self._completed_trials.add(trial_id)

        def __getstate__(self) -> dict[str, object]:
            d = dict(self.__dict__)
            d["_recorder"] = self._recorder.url_only()
            return d

    return _StudySearch


def _finished_in_study(ot_trial: Any) -> bool:
    """Whether the study already holds this Optuna trial as finished (asked of its storage)."""
    study, trial_id = getattr(ot_trial, "study", None), getattr(ot_trial, "_trial_id", None)
    if study is None or trial_id is None:
        return False
    return bool(study._storage.get_trial(trial_id).state.is_finished())


class _Recorder:
    """The driver's record of each Ray trial: a Run in the Store and the study's user attrs."""

    def __init__(self, settings: SearchSettings, store: Store | None, scheduler: str = "fifo") -> None:
        self.s, self.scheduler = settings, scheduler
        self._store = store
        self.runs: dict[str, int] = {}
        self.numbers: dict[str, int] = {}
        self.retries: dict[str, int] = {}
        self.schedule: dict[str, list[SchedulePoint]] = {}
        #: The experiment was resumed from its folder (``Tuner.restore``), not begun.
        self.resumed = False
        #: Called in the driver after each trial's Run is finished in the Store (the search's
        #: ``notify_ended``: ``on_trial`` gets each trial as it ends); what it raised, kept for later.
        self.on_ended: Callable[[], None] | None = None
        self.ended_errors: list[BaseException] = []

    def __getstate__(self) -> dict[str, object]:
        d = dict(self.__dict__)
        d["_store"] = None  # an open engine does not pickle; reopened from the URL
        d["on_ended"], d["ended_errors"] = None, []  # the driver's observer stays in the driver
        return d

    def url_only(self) -> _Recorder:
        clone = _Recorder(self.s, None, self.scheduler)
        clone.runs, clone.numbers, clone.retries = dict(self.runs), dict(self.numbers), dict(self.retries)
        clone.schedule = {k: list(v) for k, v in self.schedule.items()}
        return clone

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.s.db)
        return self._store

    def started(self, trial_id: str, number: int | None, config: Mapping[str, Any]) -> None:
        if trial_id in self.runs:
            return
        self.numbers[trial_id] = number if number is not None else len(self.numbers)
        self.runs[trial_id] = self.store.start_run(
            "trial", self.s.task_name,
            config={"params": {k: v for k, v in config.items() if k != MEMBER}, "trial": self.numbers[trial_id],
                    "epochs": self.s.epochs, "seed": self.s.seed, "backend": "ray"},
            env=self.s.env, data_fingerprint=self.s.data_fingerprint,
            parent_id=self.s.tune_run_id, study=self.s.study)

    def progress(self, trial_id: str, result: Mapping[str, Any]) -> None:
        point = {"epoch": result.get("epoch"), METRIC_KEY: result.get(METRIC_KEY, result.get(LAST_EPOCH_KEY))}
        point.update({k[len("param_"):]: v for k, v in result.items() if str(k).startswith("param_")})
        self.schedule.setdefault(trial_id, []).append(point)

    def finished(self, trial_id: str, result: Mapping[str, Any] | None,
                 error: bool) -> tuple[str, list[float] | None, TrialFigures]:
        result = result or {}
        raw = result.get("proftune_record")
        if raw:
            rec = TrialFigures.from_dict(json.loads(raw))
            state = str(rec.state or ("failed" if error else "pruned"))
        elif error:
            rec = TrialFigures(params={}, reason="the Ray worker running the trial failed after its retries",
                               from_driver=True)
            state = "failed"
        else:  # stopped by the scheduler (ASHA, PBT) before its last epoch
            rec = TrialFigures(params={}, metrics={k: v for k, v in result.items() if k == METRIC_KEY},
                               reason=f"stopped by the {self.scheduler} scheduler at epoch {result.get('epoch')}",
                               from_driver=True)
            state = "pruned"
        rec.state = state
        rec.run_id = self.runs.get(trial_id)
        rec.ray_retries = self.retries.get(trial_id, 0)
        if self.schedule.get(trial_id):
            rec.schedule = self.schedule[trial_id]
        values = [float(result[f"{METRIC_KEY}_{i}"]) for i in range(len(self.s.objectives))
                  if f"{METRIC_KEY}_{i}" in result] or None
        if state in ("complete", "infeasible") and (values is None or len(values) != len(self.s.objectives)):
            values = [-WORST if o.direction == "maximize" else WORST for o in self.s.objectives]
        run_id = self.runs.get(trial_id)
        if run_id is not None:
            with contextlib.suppress(Exception):
                self.store.finish_run(
                    run_id, status="failed" if state == "failed" else "finished",
                    error=rec.traceback or (rec.reason if state == "failed" else None),
                    metrics=rec.metrics, anomalies=rec.anomalies,
                    curves={"epoch": rec.curve if rec.curve is not None else []},
                    result={"state": state, "reason": rec.reason,
                            "constraints": rec.constraints, "trial": self.numbers.get(trial_id),
                            "steps": rec.steps, "ray_retries": rec.ray_retries})
        if self.on_ended is not None:
            try:
                self.on_ended()
            except Exception as exc:  # noqa: BLE001  (raised inside Ray's loop it would end the run unsaid)
                self.ended_errors.append(exc)
        return state, values, rec


def _callback_class() -> type:
    from ray import tune

    class _Progress(tune.Callback):
        """Counts Ray's retries of each trial and the PBT schedule of each member."""

        def __init__(self, recorder: _Recorder) -> None:
            self.recorder = recorder
            #: False under PBT, which runs without a searcher: trials are recorded here.
            self.searched = True
            #: PBT's finished members, in the order they started: (number, config, state, values, record).
            self.records: list[tuple[int, dict[str, object], str, list[float] | None, TrialFigures]] = []

        def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            self.recorder.retries[trial.trial_id] = self.recorder.retries.get(trial.trial_id, 0) + 1

        def on_trial_result(self, iteration: int, trials: list[Any], trial: Any,
                            result: dict[str, Any], **info: Any) -> None:
            if not result.get("proftune_done"):
                self.recorder.progress(trial.trial_id, result)

        def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            # a PBT member is numbered by its place in the population, not by which started first
            self.recorder.started(trial.trial_id, trial.config.get(MEMBER), trial.config)

        def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            self._finish_unsearched(trial, error=False)

        def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
            self._finish_unsearched(trial, error=True)

        def _finish_unsearched(self, trial: Any, *, error: bool) -> None:
            # PBT runs without a searcher: record the trial here, once
            if self.searched:
                return
            state, values, rec = self.recorder.finished(trial.trial_id, trial.last_result, error)
            number = self.recorder.numbers.get(trial.trial_id, len(self.records))
            self.records.append((number, trial.config, state, values, rec))

    return _Progress


def _ray_space(space: Space) -> dict[str, object]:
    """The space as Ray Tune domains (PBT's initial population and its mutations): a param with a
    ``default`` starts there (PBT's population starts from the user's current setting and the
    mutations move it within the range)."""
    from ray import tune

    out: dict[str, object] = dict(space.fixed)
    for p in space.params:
        if p.default is not None:
            out[p.name] = p.default
            continue
        if p.type == "categorical":
            out[p.name] = tune.choice(list(p.choices))
            continue
        assert p.low is not None
        assert p.high is not None
        if p.type == "int":
            out[p.name] = (tune.lograndint(int(p.low), int(p.high) + 1) if p.log
                           else tune.qrandint(int(p.low), int(p.high), int(p.step or 1)))
        elif p.log:
            out[p.name] = tune.loguniform(p.low, p.high)
        else:
            out[p.name] = tune.quniform(p.low, p.high, p.step) if p.step else tune.uniform(p.low, p.high)
    return out


class _Define:
    """Ray's define-by-run space: the Space asks the driver's Optuna trial (picklable)."""

    def __init__(self, space: Space) -> None:
        self.space = space

    def __call__(self, trial: Any) -> dict[str, object]:
        return dict(self.space.fixed) | self.space.suggest(trial)


def _record_interrupted(settings: SearchSettings, store: Store, storage: Any) -> None:
    """This driver's trials that were running when the search was interrupted: their Runs and
    Optuna trials interrupted (``interrupt_trials``); a store that cannot be reached now leaves
    them to the next run's reaping."""
    from ._storage import interrupt_trials

    with contextlib.suppress(Exception):
        mine = [r for r in store.list_runs(kind="trial", study=settings.study, status="running")
                if r.pid == os.getpid() and r.host == socket.gethostname()]
        if mine:
            interrupt_trials(optuna.load_study(study_name=settings.study, storage=storage), store, mine,
                             why="the search was interrupted (Ctrl-C or SIGTERM): its Ray trial was cancelled")


def _scheduler(settings: SearchSettings, options: RayOptions, *, population: int = 8) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    mode = "max" if settings.objectives[0].direction == "maximize" else "min"
    epochs = int(settings.epochs or 1)
    if options.scheduler == "asha":
        # stop_last_trials=False: a trial at its last epoch goes on to send its record (Ray's
        # default stops it at that epoch's report, and it would end "pruned")
        return ASHAScheduler(time_attr="epoch", metric=METRIC_KEY, mode=mode, max_t=epochs,
                             grace_period=1, reduction_factor=2, stop_last_trials=False)
    if options.scheduler == "pbt":
        mutations: dict[str, list[Any]] = {p.name: ladder(p) for p in settings.space.params
                                     if p.name in PERTURBABLE}
        if not mutations:
            raise ConfigError("scheduler='pbt' perturbs lr, weight_decay, momentum or dropout; the "
                              f"space searches none of them (it has: {', '.join(settings.space.names) or 'none'}).")
        return pbt_class()(time_attr="epoch", metric=METRIC_KEY, mode=mode,
                            perturbation_interval=options.perturbation_interval,
                            hyperparam_mutations=mutations,
                            # at least two members explore in each round
                            quantile_fraction=0.25 if population >= 8 else 0.5,
                            resample_probability=0.0, synch=True, require_attrs=False,
                            seed=settings.seed)
    return FIFOScheduler()


def run_ray(settings: SearchSettings, options: RayOptions, *, storage: Any, store: Store,
            deadline: float | None = None, finished: int = 0,
            on_ended: Callable[[], None] | None = None) -> RayRun:
    """Run the study's remaining trials on Ray; every trial lands in the study and the Store;
    ``on_ended`` is called in this process after each trial's Run is finished (what it raises is
    raised once Ray has returned).

    Returns what the run did: trials run, retries, the experiment folder and, under PBT, each
    member's schedule of params over epochs.
    """
    from ray import tune

    settings.task_name = settings.task_name or str(settings.task)
    if isinstance(settings.task, str):  # each Ray trial runs in a working directory of its own
        settings = dataclasses.replace(settings, task=absolute_spec(settings.task))
    remaining = max(0, settings.trials - finished)
    pbt = options.scheduler == "pbt"
    if options.scheduler != "fifo" and len(settings.objectives) > 1:
        raise ConfigError(f"scheduler={options.scheduler!r} needs one objective, but objectives= has "
                          f"{len(settings.objectives)}; use scheduler='fifo' for a Pareto front.")
    folder = experiment_dir(settings, options)
    out: RayRun = {"backend": "ray", "scheduler": options.scheduler, "experiment": str(folder),
                   "trials_run": 0, "retries": 0, "schedule": {}}
    if remaining == 0:
        return out
    if pbt and tune.Tuner.can_restore(str(folder)):
        # a killed PBT experiment starts its population again, in a folder of its own: restored, its
        # members' checkpoint records name checkpoints deleted after Ray's last save of them, and
        # the synchronous population waits forever for the member whose save failed
        folder = next_folder(folder)
        out["experiment"] = str(folder)
    # trials left RUNNING by a driver of this host that was killed: failed, their params queued
    # again (a resumed experiment's searcher asks for them first)
    reap_dead_trials(optuna.load_study(study_name=settings.study, storage=storage), store)
    store.reap_stale()
    with ray_session(options):
        recorder = _Recorder(settings, store, options.scheduler)
        recorder.on_ended = on_ended
        progress = _callback_class()(recorder)
        trainable = tune.with_resources(
            tune.with_parameters(ray_trainable, settings=settings, pbt=pbt), {"cpu": 1})
        tuner = _make_tuner(settings, options, trainable, recorder, progress, storage, folder,
                            remaining, deadline)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                grid = tuner.fit()
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the session's end cancels the trials
                _record_interrupted(settings, store, storage)
                raise
        numbers = dict(recorder.numbers)
        if pbt:  # the members' numbers in the study, in the order they started
            added = record_population(settings, storage, progress.records)
            numbers = {tid: added.get(n, n) for tid, n in recorder.numbers.items()}
        out["trials_run"] = len(grid)
        out["retries"] = sum(recorder.retries.values())
        out["resumed"] = recorder.resumed
        out["schedule"] = {str(numbers.get(k, k)): v for k, v in recorder.schedule.items()}
        if recorder.ended_errors:
            raise recorder.ended_errors[0]
        errors = [r.error for r in grid if r.error is not None]
        if errors and len(errors) == len(grid):
            raise RunFailedError(f"every Ray trial failed; the first error: {errors[0]}")
    return out


def _make_tuner(settings: SearchSettings, options: RayOptions, trainable: Any, recorder: _Recorder,
                progress: Any, storage: Any, folder: Path, remaining: int,
                deadline: float | None) -> Any:
    from ray import tune

    run_config = tune.RunConfig(
        name=folder.name, storage_path=str(folder.parent), verbose=0, callbacks=[progress],
        failure_config=tune.FailureConfig(max_failures=options.max_retries),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
        stop=None)
    time_budget = max(1.0, deadline - time.time()) if deadline else None
    progress.searched = options.scheduler != "pbt"
    if tune.Tuner.can_restore(str(folder)):
        tuner = tune.Tuner.restore(str(folder), trainable, resume_unfinished=True, resume_errored=True)
        # the restored run config holds the callback pickled when the experiment began; this
        # driver's own one records the rest (Ray has no public way to pass callbacks to restore)
        local = getattr(tuner, "_local_tuner", None)
        if local is not None:
            local.get_run_config().callbacks = [progress]
        recorder.resumed = True
        return tuner
    if options.scheduler == "pbt":
        size = options.population or max(2, min(remaining, 8))
        # the whole population from the start, as wide as the cluster's CPUs (a local instance:
        # ``workers``): synchronous PBT time-shares the CPUs among the members. A concurrency limit
        # below the population would add members only as others finish, and PBT would compare
        # a member with nobody (it never exploited: each member kept its start)
        cfg = tune.TuneConfig(scheduler=_scheduler(settings, options, population=size), num_samples=1,
                              search_alg=population_class()(random_state=settings.seed),
                              time_budget_s=time_budget, reuse_actors=True)
        members = population_space(_ray_space(settings.space), settings.space, size)
        return tune.Tuner(trainable, param_space=members, tune_config=cfg,
                          run_config=run_config)
    searcher = _searcher_class()(
        recorder, space=_Define(settings.space), metric=[f"{METRIC_KEY}_{i}" for i in range(len(settings.objectives))]
        if len(settings.objectives) > 1 else f"{METRIC_KEY}_0",
        mode=["max" if o.direction == "maximize" else "min" for o in settings.objectives]
        if len(settings.objectives) > 1 else ("max" if settings.objectives[0].direction == "maximize" else "min"),
        sampler=make_sampler(settings), study_name=settings.study, storage=storage)
    from ray.tune.search import ConcurrencyLimiter

    cfg = tune.TuneConfig(search_alg=ConcurrencyLimiter(searcher, max_concurrent=options.workers),
                          scheduler=_scheduler(settings, options), num_samples=remaining,
                          time_budget_s=time_budget, reuse_actors=True)
    return tune.Tuner(trainable, tune_config=cfg, run_config=run_config)


