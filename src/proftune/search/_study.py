"""The study: Optuna in the Store's database, profile-gated trials through the one fit loop.

Every trial is also a Run (kind ``trial``, linked to its study and to the ``tune`` run).
Faults are data: out-of-memory -> infeasible, NaN/Inf -> pruned with the anomaly, an exception
in user code -> failed with its traceback; the study goes on until ``max_failures``.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from ..exceptions import ConfigError, ProblemCollector, RunFailedError
from ..task import Task, load_task
from ..track import Store
from ..track._store import _sqlite_pragmas, pid_alive
from ..train import Callback, FitState, fit
from ._coarse_fine import CoarseToFineSampler
from ._constraints import Constraint, Objective, constraint_table
from ._gate import ProfileGate, free_memory, is_oom
from ._pruners import make_pruner
from ._space import Space

__all__ = ["SAMPLERS", "SearchSettings", "TrialRecord", "open_storage", "run_worker", "trial_records"]

SAMPLERS = ("tpe", "halton", "sobol", "random", "grid", "coarse-to-fine", "nsga2")
TRIAL_STATES = ("complete", "pruned", "infeasible", "failed", "running")
#: What an infeasible trial reports as its objective when the objective was not measured:
#: finite (NSGA-II's crowding distance subtracts values), and never a best.
WORST = 1e300
ATTR = "proftune"
HEARTBEAT_INTERVAL_S = 5
GRACE_PERIOD_S = 30
MAX_RETRY = 2


@dataclass
class SearchSettings:
    """Everything a worker process needs to run trials of a study (picklable)."""

    task: Any  # a task spec string, or a Task (single process)
    space: Space
    objectives: list[Objective]
    constraints: list[Constraint]
    trials: int
    study: str
    db: str
    sampler: str = "tpe"
    pruner: str = "none"
    epochs: int | None = None
    max_steps: int | None = None
    timeout: float | None = None
    seed: int = 0
    device: str = "auto"
    max_failures: int = 5
    gate_steps: int = 3
    gate_warmup: int = 1
    grid_points: int = 5
    #: The coarse pass of ``coarse-to-fine``: ``halton`` or ``grid`` (``grid_points`` per param).
    coarse: str = "halton"
    workers: int = 1
    tune_run_id: int | None = None
    data_fingerprint: str | None = None
    env: dict[str, Any] = field(default_factory=dict)
    task_name: str = ""

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]


@dataclass
class TrialRecord:
    """One trial as the search reports it."""

    number: int
    state: str
    params: dict[str, Any]
    values: list[float] | None
    metrics: dict[str, float]
    constraints: dict[str, Any]
    reason: str | None
    duration_s: float | None
    run_id: int | None = None
    stage: str | None = None
    steps: int = 0
    train_s: float = 0.0
    gate_s: float = 0.0
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    traceback: str | None = None
    retried_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number, "state": self.state, "params": self.params,
            "values": self.values, "metrics": self.metrics, "constraints": self.constraints,
            "reason": self.reason, "duration_s": self.duration_s, "run_id": self.run_id,
            "stage": self.stage, "steps": self.steps, "train_s": self.train_s,
            "gate_s": self.gate_s, "anomalies": self.anomalies, "traceback": self.traceback,
            "retried_from": self.retried_from,
        }


# -- storage ----------------------------------------------------------------------------------
def open_storage(url: str, *, heartbeat: bool | None = None) -> RDBStorage:
    """Optuna's RDB storage on the Store's database (same URL, same file).

    ``heartbeat`` (default: on for server databases, off for SQLite): Optuna's heartbeat marks a
    trial whose process stopped beating failed after ``GRACE_PERIOD_S`` and re-enqueues its
    configuration; that is how a trial killed on another machine is found. SQLite lives on one
    machine, where :func:`reap_dead_trials` finds a killed trial at once from its Run's process
    id, so SQLite studies skip the heartbeat's 20-30 ms per trial.
    """
    is_sqlite = url.startswith("sqlite")
    if heartbeat is None:
        heartbeat = not is_sqlite
    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if is_sqlite else {"pool_pre_ping": True}
    extra: dict[str, Any] = {}
    if heartbeat:
        extra = {"heartbeat_interval": HEARTBEAT_INTERVAL_S, "grace_period": GRACE_PERIOD_S,
                 "heartbeat_stale_trial_callback": _retry_callback()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = _retry_locked(lambda: RDBStorage(url, engine_kwargs=kwargs, **extra))
    if is_sqlite:
        sa.event.listen(storage.engine, "connect", _sqlite_pragmas)
        storage.engine.dispose()
    return storage


def _retry_callback() -> RetryHeartbeatStaleTrialCallback:
    """Re-enqueue a stale (killed) trial's configuration, at most ``MAX_RETRY`` times."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)


def _retry_locked(fn: Any, attempts: int = 30) -> Any:
    """SQLite says 'database is locked' while another worker creates tables; wait and retry."""
    delay = 0.05
    for attempt in range(attempts):
        try:
            return fn()
        except sa.exc.OperationalError as exc:
            if "locked" not in str(exc).lower() or attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


# -- samplers ---------------------------------------------------------------------------------
def make_sampler(settings: SearchSettings, worker: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler called ``settings.sampler``; each worker gets its own seed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _make_sampler(settings, worker)


def _make_sampler(settings: SearchSettings, worker: int) -> optuna.samplers.BaseSampler:
    name, seed = settings.sampler, settings.seed + 1000 * worker
    n = settings.trials
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)  # Optuna's defaults (10 random startup trials)
    if name in ("halton", "sobol"):
        return optuna.samplers.QMCSampler(qmc_type=name, scramble=True, seed=settings.seed,
                                          warn_independent_sampling=False,
                                          warn_asynchronous_seeding=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(settings.space.grid(settings.grid_points), seed=settings.seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, n // 4)))
    if name == "coarse-to-fine":
        grid = settings.space.grid(settings.grid_points) if settings.coarse == "grid" else None
        return CoarseToFineSampler(n_coarse=max(2, n // 2), seed=seed, grid=grid)
    raise ConfigError(f"--sampler {name!r} is unknown; valid: {', '.join(SAMPLERS)}.")


# -- the pruning callback ---------------------------------------------------------------------
class _PruningCallback(Callback):
    """Reports each epoch's objective metric to the trial; stops the fit loop when pruned."""

    def __init__(self, trial: optuna.Trial, metric: str | None, pruner: str) -> None:
        self.trial, self.metric, self.pruner = trial, metric, pruner
        self.pruned_reason: str | None = None

    def on_epoch_end(self, state: FitState) -> None:
        if self.metric is None:
            return
        value = state.metrics.get(self.metric)
        if value is None:
            return
        if not math.isfinite(value):
            state.record_anomaly("nonfinite_metric", metric=self.metric, value=str(value))
            self.pruned_reason = f"{self.metric}={value} at epoch {state.epoch}"
            state.request_stop(self.pruned_reason)
            return
        if self.pruner == "none":
            return  # nothing reads the reports: save a database write per epoch
        self.trial.report(float(value), step=state.epoch)
        if self.trial.should_prune():
            self.pruned_reason = (f"pruned by the {self.pruner} pruner at epoch {state.epoch} "
                                  f"({self.metric}={value:.4g})")
            state.request_stop(self.pruned_reason)


class _TrialFailed(Exception):
    """User code raised: the trial is failed (traceback stored) and the study goes on."""


class _Surplus(Exception):
    """Workers raced for the last trial of the budget; this one is dropped before it runs."""


def _slot_table(study: optuna.Study) -> list[tuple[int, str, bool, bool]]:
    """(number, state, failed in user code, surplus) of every trial, in one SQL query.

    Runs before every trial, so it reads two columns instead of building every FrozenTrial.
    """
    backend = getattr(study._storage, "_backend", study._storage)
    engine = getattr(backend, "engine", None)
    if engine is None:  # not an RDB storage
        return [(t.number, t.state.name, bool(t.user_attrs.get(f"{ATTR}_failed")),
                 bool(t.user_attrs.get(f"{ATTR}_surplus"))) for t in study.get_trials(deepcopy=False)]
    query = sa.text(
        "SELECT t.number, t.state, a.key FROM trials t LEFT JOIN trial_user_attributes a "
        "ON a.trial_id = t.trial_id AND a.key IN (:failed, :surplus) WHERE t.study_id = :sid")
    with engine.connect() as conn:
        rows = conn.execute(query, {"failed": f"{ATTR}_failed", "surplus": f"{ATTR}_surplus",
                                    "sid": study._study_id}).all()
    table: dict[int, list[Any]] = {}
    for number, state, key in rows:
        entry = table.setdefault(int(number), [int(number), str(state), False, False])
        if key == f"{ATTR}_failed":
            entry[2] = True
        elif key == f"{ATTR}_surplus":
            entry[3] = True
    return [(e[0], e[1], e[2], e[3]) for e in table.values()]


def _occupies(state: str, failed: bool) -> bool:
    """Counts against ``--trials``: finished, running or queued; not killed-and-retried, not surplus."""
    return state in ("COMPLETE", "PRUNED", "RUNNING", "WAITING") or (state == "FAIL" and failed)


def _slots_before(trial: optuna.Trial) -> int:
    """Slot-holding trials numbered before ``trial``: trial numbers order the workers' races."""
    return sum(1 for number, state, failed, _ in _slot_table(trial.study)
               if number < trial.number and _occupies(state, failed))


# -- one trial ----------------------------------------------------------------------------------
class TrialRunner:
    """The Optuna objective: gate, train through ``fit``, record a Run, classify faults."""

    def __init__(self, settings: SearchSettings, task: Task, store: Store) -> None:
        self.s, self.task, self.store = settings, task, store
        self.gate = ProfileGate(settings.constraints,
                                needed=[o.metric for o in settings.objectives if o.is_profile],
                                steps=settings.gate_steps, warmup=settings.gate_warmup,
                                device=settings.device, seed=settings.seed)
        first = settings.objectives[0]
        self.report_metric = None if (first.is_profile or len(settings.objectives) > 1) else first.metric
        self.stage: str | None = None
        #: Callbacks added to every trial's fit loop (a backend's reporting, PBT's restore).
        self.extra_callbacks: list[Callback] = []
        self.only: list[str] | None = None
        self.preset: dict[str, Any] = {}

    def __call__(self, trial: optuna.Trial) -> Sequence[float] | float:
        started = time.perf_counter()
        if _slots_before(trial) >= self.s.trials:
            # another worker took the last slot between our check and this trial's creation
            trial.set_user_attr(f"{ATTR}_surplus", True)
            raise _Surplus(f"trial {trial.number}: the study already has {self.s.trials} trials")
        params = self.s.space.suggest(trial, only=self.only, preset=self.preset)
        config = {**self.s.space.fixed, **params}
        run_id = self.store.start_run(
            "trial", self.s.task_name, config={"params": config, "trial": trial.number,
                                               "epochs": self.s.epochs, "seed": self.s.seed},
            env=self.s.env, data_fingerprint=self.s.data_fingerprint,
            parent_id=self.s.tune_run_id, study=self.s.study)
        rec: dict[str, Any] = {"params": config, "metrics": {}, "constraints": {}, "reason": None,
                               "steps": 0, "train_s": 0.0, "gate_s": 0.0, "anomalies": [],
                               "stage": self.stage, "run_id": run_id}
        try:
            return self._run(trial, config, rec)
        except optuna.TrialPruned:
            self._finish(trial, rec, "pruned", started)
            raise
        except _TrialFailed:
            self._finish(trial, rec, "failed", started)
            raise
        finally:
            free_memory()

    def _run(self, trial: optuna.Trial, config: dict[str, Any], rec: dict[str, Any]) -> Sequence[float] | float:
        started = time.perf_counter()
        rule = self.s.space.forbidden(config)
        if rule is not None:
            trial.set_constraint("forbid", 1.0)
            rec["reason"] = f"forbidden by rule: {rule.describe()}"
            return self._infeasible(trial, rec, started)
        try:
            if self.gate.active:
                g = self.gate.check(self.task, config)
                rec["gate_s"] = g.duration_s
                rec["metrics"].update(g.metrics)
                for key, v in g.violations.items():
                    trial.set_constraint(key, v)
                rec["constraints"] = constraint_table(self.gate.constraints, rec["metrics"])
                if not g.feasible:
                    rec["reason"] = "; ".join(g.reasons)
                    return self._infeasible(trial, rec, started)
            t0 = time.perf_counter()
            cb = _PruningCallback(trial, self.report_metric, self.s.pruner)
            try:
                result = fit(self.task, config, epochs=self.s.epochs, max_steps=self.s.max_steps,
                             device=self.s.device, seed=self.s.seed,
                             callbacks=[cb, *self.extra_callbacks])
            finally:
                rec["train_s"] = time.perf_counter() - t0
            rec["steps"] = result.steps
            rec["anomalies"] = result.anomalies
            rec["metrics"].update(result.metrics)
            rec["curve"] = [{k: v for k, v in e.items() if isinstance(v, (int, float))}
                            for e in result.curves.get("epoch", [])]
            del result
        except Exception as exc:
            if is_oom(exc):
                trial.set_constraint("oom", 1.0)
                rec["reason"] = f"out of memory: {str(exc).splitlines()[0][:300]}"
                return self._infeasible(trial, rec, started)
            rec["reason"] = f"{type(exc).__name__}: {exc}"
            rec["traceback"] = traceback.format_exc()[-8000:]
            raise _TrialFailed(rec["reason"]) from exc
        nan = [a for a in rec["anomalies"] if a.get("kind") in ("nan_loss", "nonfinite_metric")]
        if nan:
            rec["reason"] = f"non-finite values: {nan[0]}"
            raise optuna.TrialPruned(rec["reason"])
        if cb.pruned_reason is not None:
            rec["reason"] = cb.pruned_reason
            raise optuna.TrialPruned(rec["reason"])
        # constraints on task metrics: known only after training
        post = [c for c in self.s.constraints if not c.is_profile]
        reasons = []
        for c in post:
            value = rec["metrics"].get(c.metric)
            if value is None:
                rec["reason"] = f"the task's metrics have no {c.metric!r} for constraint {c.text!r}"
                raise _TrialFailed(rec["reason"])
            v = c.violation(float(value))
            trial.set_constraint(c.key, v)
            if v > 0:
                reasons.append(c.reason(float(value)))
        rec["constraints"] = constraint_table(self.s.constraints, rec["metrics"])
        values = []
        for o in self.s.objectives:
            if o.metric not in rec["metrics"]:
                rec["reason"] = (f"objective metric {o.metric!r} was not measured; task metrics: "
                                 f"{', '.join(sorted(rec['metrics']))}")
                raise _TrialFailed(rec["reason"])
            values.append(float(rec["metrics"][o.metric]))
        if not all(math.isfinite(v) for v in values):
            rec["anomalies"].append({"kind": "nonfinite_objective", "values": [str(v) for v in values]})
            rec["reason"] = f"objective is not finite: {values}"
            raise optuna.TrialPruned(rec["reason"])
        if reasons:
            rec["reason"] = "; ".join(reasons)
            self._finish(trial, rec, "infeasible", started)
        else:
            self._finish(trial, rec, "complete", started)
        return values[0] if len(values) == 1 else values

    def _infeasible(self, trial: optuna.Trial, rec: dict[str, Any], started: float) -> Sequence[float] | float:
        values = []
        for o in self.s.objectives:
            measured = rec["metrics"].get(o.metric)
            if measured is not None and math.isfinite(float(measured)):
                values.append(float(measured))
            else:
                values.append(-WORST if o.direction == "maximize" else WORST)
        self._finish(trial, rec, "infeasible", started)
        return values[0] if len(values) == 1 else values

    def _finish(self, trial: optuna.Trial, rec: dict[str, Any], state: str, started: float) -> None:
        rec["state"] = state
        rec["duration_s"] = time.perf_counter() - started
        trial.set_user_attr(ATTR, rec)
        if state == "failed":  # read by the slot count, which does not parse the record
            trial.set_user_attr(f"{ATTR}_failed", True)
        status = "failed" if state == "failed" else "finished"
        with contextlib.suppress(Exception):
            self.store.finish_run(
                rec["run_id"], status=status, error=rec.get("traceback") or (rec["reason"] if status == "failed" else None),
                metrics=rec["metrics"], anomalies=rec["anomalies"],
                curves={"epoch": rec.get("curve", [])},
                result={"state": state, "reason": rec["reason"], "constraints": rec["constraints"],
                        "trial": trial.number, "steps": rec["steps"], "train_s": rec["train_s"],
                        "gate_s": rec["gate_s"]})


# -- reading the study ------------------------------------------------------------------------
def _state_of(t: FrozenTrial) -> str:
    rec = t.user_attrs.get(ATTR) or {}
    if t.state == TrialState.RUNNING or t.state == TrialState.WAITING:
        return "running"
    if rec.get("state") in TRIAL_STATES:
        return str(rec["state"])
    if t.state == TrialState.COMPLETE:
        return "infeasible" if any(v > 0 for v in t.constraints.values()) else "complete"
    if t.state == TrialState.PRUNED:
        return "pruned"
    return "failed"


def trial_records(study: optuna.Study) -> list[TrialRecord]:
    """Every trial of ``study`` in our terms (complete, pruned, infeasible, failed, running)."""
    out = []
    for t in study.get_trials(deepcopy=False):
        rec = t.user_attrs.get(ATTR) or {}
        if t.user_attrs.get(f"{ATTR}_surplus"):
            continue
        state = _state_of(t)
        duration = rec.get("duration_s")
        if duration is None and t.datetime_start and t.datetime_complete:
            duration = (t.datetime_complete - t.datetime_start).total_seconds()
        reason = rec.get("reason")
        if t.state == TrialState.FAIL and not rec:
            reason = "the process running the trial died (heartbeat lost or killed); its configuration is retried"
        values = list(t.values) if (t.values is not None and state == "complete") else None
        out.append(TrialRecord(
            number=t.number, state=state, params=rec.get("params") or dict(t.params), values=values,
            metrics=rec.get("metrics") or {}, constraints=rec.get("constraints") or {},
            reason=reason, duration_s=duration, run_id=rec.get("run_id"),
            stage=rec.get("stage"), steps=int(rec.get("steps") or 0),
            train_s=float(rec.get("train_s") or 0.0), gate_s=float(rec.get("gate_s") or 0.0),
            anomalies=rec.get("anomalies") or [], traceback=rec.get("traceback"),
            retried_from=t.system_attrs.get("failed_trial"),
        ))
    return out


def _counts(study: optuna.Study) -> dict[str, int]:
    c = dict.fromkeys(("finished", "running", "waiting", "failed"), 0)
    for _, state, failed, _ in _slot_table(study):
        if state in ("COMPLETE", "PRUNED"):
            c["finished"] += 1
        elif state == "FAIL" and failed:
            c["finished"] += 1
            c["failed"] += 1
        elif state == "RUNNING":
            c["running"] += 1
        elif state == "WAITING":
            c["waiting"] += 1
    return c


def reap_dead_trials(study: optuna.Study, store: Store) -> list[int]:
    """Fail the RUNNING trials whose process on this host is gone, and enqueue their retry.

    The heartbeat does the same for any machine after ``GRACE_PERIOD_S``; on the same host the
    trial's Run (host, process id) says it at once, so a resumed study does not wait out the
    grace period. Call before :meth:`Store.reap_stale` (which marks those Runs failed).
    """
    host, me = socket.gethostname(), os.getpid()
    reaped = []
    retry = _retry_callback()
    for run in store.list_runs(kind="trial", study=study.study_name, status="running"):
        number = run.config.get("trial")
        if run.host != host or run.pid is None or run.pid == me or pid_alive(int(run.pid)) or number is None:
            continue
        try:
            trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, int(number))
            if study._storage.get_trial(trial_id).state != TrialState.RUNNING:
                continue
            ok = study._storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
        except (KeyError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            continue
        if ok:
            retry(study, study._storage.get_trial(trial_id))
            reaped.append(int(number))
    return reaped


# -- staged search (tiers) ----------------------------------------------------------------------
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


def _best_params(study: optuna.Study, objectives: Sequence[Objective], stages: Sequence[str]) -> dict[str, Any]:
    """The full configuration of the best feasible complete trial among ``stages``."""
    best: TrialRecord | None = None
    sign = -1.0 if objectives[0].direction == "maximize" else 1.0
    for r in trial_records(study):
        if r.state == "complete" and r.stage in stages and r.values:
            if best is None or sign * r.values[0] < sign * (best.values or [0.0])[0]:
                best = r
    return dict(best.params) if best else {}


# -- the worker loop ----------------------------------------------------------------------------
def run_worker(settings: SearchSettings, worker: int = 0, deadline: float | None = None, *,
               storage: RDBStorage | None = None) -> dict[str, Any]:
    """Run trials of ``settings.study`` until it has ``settings.trials`` finished ones.

    Several workers (processes, machines) may run this on one study at once. Returns what this
    worker did.
    """
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    task = load_task(settings.task)
    settings.task_name = settings.task_name or task.name or type(task).__name__
    store = Store(settings.db)
    storage = storage or open_storage(settings.db)
    study = optuna.load_study(study_name=settings.study, storage=storage,
                              sampler=make_sampler(settings, worker),
                              pruner=make_pruner(settings.pruner, settings.space.pruner))
    reap_dead_trials(study, store)
    store.reap_stale()
    runner = TrialRunner(settings, task, store)
    ran = 0
    while True:
        if deadline is not None and time.time() >= deadline:
            break
        c = _counts(study)
        if c["failed"] > settings.max_failures:
            break
        if c["finished"] >= settings.trials:
            break
        if c["finished"] + c["running"] >= settings.trials and c["waiting"] == 0:
            break
        sampler = study.sampler
        if isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study):
            break
        if settings.space.tiers:
            stage = _stage_for(settings.space, settings.trials, c["finished"] + c["running"])
            if stage is None:
                break
            idx = settings.space.tiers.index(stage)
            runner.stage = stage
            runner.only = [p.name for p in settings.space.params if p.tier == stage]
            runner.preset = _best_params(study, settings.objectives, settings.space.tiers[:idx])
        study.optimize(runner, n_trials=1, catch=(_TrialFailed, _Surplus), gc_after_trial=False,
                       show_progress_bar=False)
        ran += 1
    return {"worker": worker, "trials_run": ran}


def check_settings(settings: SearchSettings, problems: ProblemCollector) -> None:
    """Problems of the combination of options (each option alone is checked where parsed)."""
    multi = len(settings.objectives) > 1
    if settings.pruner != "none":
        if multi:
            problems.add(f"--pruner {settings.pruner} needs one objective; Optuna cannot prune "
                         f"multi-objective trials (objectives: {[o.text for o in settings.objectives]}).")
        elif settings.objectives and settings.objectives[0].is_profile:
            problems.add(f"--pruner {settings.pruner} needs a task metric as the objective, but got "
                         f"{settings.objectives[0].text!r} (a profile metric, known before training).")
    if settings.coarse not in ("halton", "grid"):
        problems.add(f"coarse={settings.coarse!r} is unknown; valid: halton, grid.")
    if settings.sampler == "coarse-to-fine" and multi:
        problems.add("--sampler coarse-to-fine ranks trials by one objective; give one --objective "
                     "or use --sampler nsga2 / tpe for a Pareto front.")
    if settings.space.tiers and multi:
        problems.add("a staged space (tiers) fixes each stage's best by one objective; give one --objective.")
    if settings.space.tiers and settings.sampler in ("grid", "halton", "sobol"):
        problems.add(f"--sampler {settings.sampler} needs every param in each trial; a staged space "
                     "(tiers) searches a few at a time; use tpe, random or nsga2.")
    if settings.trials < 1:
        problems.add(f"--trials must be at least 1, but got {settings.trials}.")
    if settings.workers < 1:
        problems.add(f"--workers must be at least 1, but got {settings.workers}.")
    if settings.max_failures < 0:
        problems.add(f"--max-failures must be >= 0, but got {settings.max_failures}.")
    if settings.timeout is not None and settings.timeout <= 0:
        problems.add(f"--timeout must be > 0 seconds, but got {settings.timeout}.")
    if settings.epochs is not None and settings.epochs < 1:
        problems.add(f"--epochs must be at least 1, but got {settings.epochs}.")
    if settings.pruner == "patience" and int(settings.space.pruner.get("patience", 2)) < 1:
        problems.add(f"pruner patience={settings.space.pruner.get('patience')} must be >= 1.")


def raise_if_too_many_failures(study: optuna.Study, max_failures: int) -> None:
    c = _counts(study)
    if c["failed"] > max_failures:
        last = [r for r in trial_records(study) if r.state == "failed"][-1]
        raise RunFailedError(
            f"{c['failed']} trials failed (more than --max-failures={max_failures}); the last: "
            f"trial {last.number}: {last.reason}\n{last.traceback or ''}".rstrip())
