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
import logging
import os
import signal
import socket
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
import torch

from .._jsonsafe import finite_float, json_dumps
from ..exceptions import ConfigError, DependencyError, RunFailedError
from ..task import Task, absolute_spec, load_task
from ..track import Store
from ..train import Callback, FitState, evaluate_model
from ._pbt import (
    MEMBER,
    PERTURBABLE,
    ladder,
    pbt_class,
    population_class,
    population_space,
    record_population,
)
from ._records import ATTR
from ._samplers import make_sampler
from ._settings import SearchSettings
from ._space import Space
from ._storage import reap_dead_trials
from ._trial import WORST, TrialRunner
from ._trial import TrialFailed as _TrialFailed

__all__ = ["PERTURBABLE", "SCHEDULERS", "RayOptions", "run_ray"]

SCHEDULERS = ("fifo", "asha", "pbt")
_METRIC = "objective"
#: The objective at a trial's last epoch: recorded, not seen by the schedulers.
_LAST = "objective_last_epoch"
_CKPT = "proftune_ckpt.pt"


def _ray() -> Any:
    """Import Ray quietly, usage stats off; a missing install is a :class:`DependencyError`."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # nothing leaves the machine (issue 14)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # intermediate reports carry the per-epoch metric, the last one the objective values
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import ray
            from ray import tune  # noqa: F401
    except ImportError as exc:
        raise DependencyError(
            "backend='ray' needs Ray Tune, which is not installed; install the extra: "
            "pip install 'proftune[ray]'.") from exc
    for name in ("ray", "ray.tune", "ray.train", "ray.air", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return ray


class RayOptions:
    """How to run on Ray: where (``address``), how wide (``workers``), which scheduler."""

    def __init__(self, *, address: str | None = None, scheduler: str = "fifo", workers: int = 1,
                 storage_path: str | Path | None = None, max_retries: int = 2,
                 population: int | None = None, perturbation_interval: int = 1,
                 debug: bool = False) -> None:
        if scheduler not in SCHEDULERS:
            raise ConfigError(f"scheduler={scheduler!r} is unknown; valid: {', '.join(SCHEDULERS)}.")
        if workers < 1:
            raise ConfigError(f"workers={workers!r} must be >= 1.")
        if address is not None and address != "auto" and ":" not in address:
            raise ConfigError(f"address={address!r} is malformed; give 'auto' or 'HOST:PORT'.")
        self.address, self.scheduler, self.workers = address, scheduler, int(workers)
        self.storage_path = Path(storage_path) if storage_path else None
        self.max_retries, self.population = int(max_retries), population
        self.perturbation_interval, self.debug = int(perturbation_interval), debug


# -- inside the Ray worker ----------------------------------------------------------------------
class _RayReport(Callback):
    """Each epoch: report the objective metric to Ray (ASHA, PBT), with a checkpoint for PBT."""

    def __init__(self, metric: str | None, *, checkpoint: bool, sign: float,
                 last_epoch: int | None = None) -> None:
        self.metric, self.checkpoint, self.sign = metric, checkpoint, sign
        self.last_epoch = last_epoch
        self.schedule: list[dict[str, Any]] = []

    def on_epoch_end(self, state: FitState) -> None:
        from ray import tune

        value = state.metrics.get(self.metric) if self.metric else None
        report: dict[str, Any] = {"epoch": state.epoch, "proftune_done": False}
        last = self.last_epoch is not None and state.epoch >= self.last_epoch
        if (finite := finite_float(value)) is not None:
            # the last epoch's value under another name: the schedulers act on ``objective``,
            # and a trial that trained every epoch is complete (ASHA would cut it at its top
            # rung, PBT would pause it for a round with nothing left to train)
            report[_LAST if last else _METRIC] = finite
        for key in PERTURBABLE:
            if key in state.params:
                report[f"param_{key}"] = state.params[key]
        if not self.checkpoint or last:
            tune.report(report)
            return
        with tempfile.TemporaryDirectory() as tmp:
            opt = state.optimizer.state_dict() if state.optimizer is not None else None
            torch.save({"model": state.model.state_dict(), "optimizer": opt, "epoch": state.epoch,
                        "step": state.step}, Path(tmp) / _CKPT)
            tune.report(report, checkpoint=tune.Checkpoint.from_directory(tmp))


class _RestoreCheckpoint(Callback):
    """PBT: continue a member from its (or an exploited member's) checkpoint, at the new params."""

    def __init__(self, checkpoint: Any, epochs: int) -> None:
        self.checkpoint, self.epochs = checkpoint, epochs

    def on_fit_start(self, state: FitState) -> None:
        if self.checkpoint is None:
            return
        with self.checkpoint.as_directory() as folder:
            # a checkpoint this trainable wrote itself, in this experiment: tensors and ints only
            saved = torch.load(Path(folder) / _CKPT, map_location=state.device, weights_only=True)
        state.model.load_state_dict(saved["model"])
        if state.optimizer is not None and saved.get("optimizer") is not None:
            state.optimizer.load_state_dict(saved["optimizer"])
            for group in state.optimizer.param_groups:  # the perturbed params win
                for key in ("lr", "weight_decay", "momentum"):
                    if key in state.params and key in group:
                        group[key] = float(state.params[key])
        state.epoch, state.step = int(saved["epoch"]), int(saved["step"])
        if state.epoch >= self.epochs and state.task is not None:
            # exploited after its last epoch: nothing left to train; its metrics are those of
            # the weights it now holds
            state.metrics = evaluate_model(state.task, state.model, state.device, state.batch_size)


class _WorkerRunner(TrialRunner):
    """The local trial runner without the Store: the driver records the Run."""

    def __init__(self, settings: SearchSettings, task: Task) -> None:
        super().__init__(settings, task, store=None)  # type: ignore[arg-type]
        self.record: dict[str, Any] | None = None

    def _finish(self, trial: Any, rec: dict[str, Any], state: str, started: float) -> None:
        rec["state"] = state
        rec["duration_s"] = time.perf_counter() - started
        self.record = rec


def _trainable(config: dict[str, Any], settings: SearchSettings, pbt: bool) -> None:
    """One trial on a Ray worker: gate, train through ``fit``, report the record."""
    from ray import tune

    config = {k: v for k, v in config.items() if k != MEMBER}
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    from .._threads import limit_threads

    limit_threads(torch.get_num_threads())  # Ray's CPUs for this trial: the fit loop's most threads
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    task = load_task(settings.task)
    runner = _WorkerRunner(settings, task)
    sign = -1.0 if settings.objectives[0].direction == "maximize" else 1.0
    metric = settings.objectives[0].metric if runner.report_metric or pbt else None
    runner.extra_callbacks = [_RayReport(metric, checkpoint=pbt, sign=sign, last_epoch=settings.epochs)]
    if pbt:
        runner.extra_callbacks.insert(0, _RestoreCheckpoint(tune.get_checkpoint(), int(settings.epochs or 1)))
    trial = optuna.trial.FixedTrial(config)
    rec: dict[str, Any] = {"params": dict(config), "metrics": {}, "constraints": {}, "reason": None,
                           "steps": 0, "train_s": 0.0, "gate_s": 0.0, "anomalies": [],
                           "stage": None, "run_id": None, "repeat": 0, "seed": settings.seed}
    started = time.perf_counter()
    values: Any = None
    try:
        values = runner._run(trial, dict(config), rec)  # type: ignore[arg-type]
    except optuna.TrialPruned:
        runner._finish(trial, rec, "pruned", started)
    except _TrialFailed:
        runner._finish(trial, rec, "failed", started)
    record = runner.record or rec
    record["constraints_raw"] = dict(trial.constraints)
    record["user_attrs_raw"] = {k: v for k, v in trial.user_attrs.items() if k != ATTR}
    final: dict[str, Any] = {"proftune_done": True, "proftune_record": json_dumps(record),
                             "epoch": int(settings.epochs or 1)}
    if values is not None:  # for the searcher; the schedulers decide on the epochs' reports only
        vals = values if isinstance(values, (list, tuple)) else [values]
        final.update({f"{_METRIC}_{i}": float(v) for i, v in enumerate(vals)})
    # no ``objective`` here: synchronous PBT would pause a member on this report, waiting for the
    # others, and restore it from its last checkpoint again and again
    tune.report(final)


# -- on the driver ------------------------------------------------------------------------------
def _searcher_class() -> type:
    from ray.tune.search.optuna import OptunaSearch

    class _StudySearch(OptunaSearch):
        """Ray's ``OptunaSearch`` on the study's storage that records trials as proftune does."""

        def __init__(self, recorder: _Recorder, **kw: Any) -> None:
            super().__init__(**kw)
            self._recorder = recorder

        def suggest(self, trial_id: str) -> dict[str, Any] | None:
            config = super().suggest(trial_id)
            if config is not None:
                self._recorder.started(trial_id, self._ot_trials[trial_id].number, config)
            return config

        def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
            if result.get("proftune_done") or trial_id not in self._ot_trials:
                return
            value, epoch = result.get(_METRIC), result.get("epoch")
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
            for key, v in rec.get("constraints_raw", {}).items():
                ot_trial.set_constraint(key, float(v))
            rec.pop("constraints_raw", None)
            for key, value in rec.pop("user_attrs_raw", {}).items():  # gated, failed flags
                ot_trial.set_user_attr(key, value)
            ot_trial.set_user_attr(ATTR, rec)
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

        def __getstate__(self) -> dict[str, Any]:
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
        self.schedule: dict[str, list[dict[str, Any]]] = {}
        #: The experiment was resumed from its folder (``Tuner.restore``), not begun.
        self.resumed = False
        #: Called in the driver after each trial's Run is finished in the Store (the search's
        #: ``notify_ended``: ``on_trial`` gets each trial as it ends); what it raised, kept for later.
        self.on_ended: Callable[[], None] | None = None
        self.ended_errors: list[BaseException] = []

    def __getstate__(self) -> dict[str, Any]:
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
        point = {"epoch": result.get("epoch"), _METRIC: result.get(_METRIC, result.get(_LAST))}
        point.update({k[len("param_"):]: v for k, v in result.items() if str(k).startswith("param_")})
        self.schedule.setdefault(trial_id, []).append(point)

    def finished(self, trial_id: str, result: Mapping[str, Any] | None,
                 error: bool) -> tuple[str, list[float] | None, dict[str, Any]]:
        result = result or {}
        raw = result.get("proftune_record")
        if raw:
            rec: dict[str, Any] = json.loads(raw)
            state = str(rec.get("state") or ("failed" if error else "pruned"))
        elif error:
            rec = {"params": {}, "metrics": {}, "constraints": {}, "anomalies": [], "steps": 0,
                   "reason": "the Ray worker running the trial failed after its retries",
                   "train_s": 0.0, "gate_s": 0.0}
            state = "failed"
        else:  # stopped by the scheduler (ASHA, PBT) before its last epoch
            rec = {"params": {}, "metrics": {k: v for k, v in result.items() if k == _METRIC},
                   "constraints": {}, "anomalies": [], "steps": 0, "train_s": 0.0, "gate_s": 0.0,
                   "reason": f"stopped by the {self.scheduler} scheduler at epoch {result.get('epoch')}"}
            state = "pruned"
        rec["state"] = state
        rec["run_id"] = self.runs.get(trial_id)
        rec["ray_retries"] = self.retries.get(trial_id, 0)
        if self.schedule.get(trial_id):
            rec["schedule"] = self.schedule[trial_id]
        values = [float(result[f"{_METRIC}_{i}"]) for i in range(len(self.s.objectives))
                  if f"{_METRIC}_{i}" in result] or None
        if state in ("complete", "infeasible") and (values is None or len(values) != len(self.s.objectives)):
            values = [-WORST if o.direction == "maximize" else WORST for o in self.s.objectives]
        run_id = self.runs.get(trial_id)
        if run_id is not None:
            with contextlib.suppress(Exception):
                self.store.finish_run(
                    run_id, status="failed" if state == "failed" else "finished",
                    error=rec.get("traceback") or (rec.get("reason") if state == "failed" else None),
                    metrics=rec.get("metrics") or {}, anomalies=rec.get("anomalies") or [],
                    curves={"epoch": rec.get("curve", [])},
                    result={"state": state, "reason": rec.get("reason"),
                            "constraints": rec.get("constraints"), "trial": self.numbers.get(trial_id),
                            "steps": rec.get("steps"), "ray_retries": rec["ray_retries"]})
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
            self.records: list[tuple[int, dict[str, Any], str, list[float] | None, dict[str, Any]]] = []

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


def _ray_space(space: Space, *, start_at_default: bool = False) -> dict[str, Any]:
    """The space as Ray Tune domains (PBT's initial population and its mutations).

    ``start_at_default``: a param with a ``default`` starts there (PBT's population starts
    from the user's current setting and the mutations move it within the range).
    """
    from ray import tune

    out: dict[str, Any] = dict(space.fixed)
    for p in space.params:
        if start_at_default and p.default is not None:
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

    def __call__(self, trial: Any) -> dict[str, Any]:
        return dict(self.space.fixed) | self.space.suggest(trial)


def _experiment_dir(settings: SearchSettings, options: RayOptions) -> Path:
    root = options.storage_path or Path(os.environ.get("PROFTUNE_RAY_DIR", "proftune-ray"))
    return (root / settings.study).resolve()


def _next_folder(folder: Path) -> Path:
    """``STUDY-2``, ``STUDY-3``, ...: the first beside ``folder`` that holds no experiment."""
    from ray import tune

    n = 2
    while tune.Tuner.can_restore(str(folder.with_name(f"{folder.name}-{n}"))):
        n += 1
    return folder.with_name(f"{folder.name}-{n}")


def _on_loopback(address: str | None) -> bool:
    """A local instance, or a cluster on this machine's loopback (``127.0.0.1:P``)."""
    return address is None or address.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")


@contextlib.contextmanager
def _loopback_node_ip() -> Iterator[None]:
    """While Ray starts or joins: this node's address is 127.0.0.1, never the outward one.

    Ray resolves a loopback ``_node_ip_address`` to the machine's outward-facing address unless
    its switch ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is off; that env var is read once, when Ray
    is first imported, so the switch is flipped here for the start only. With the node on
    127.0.0.1, Ray's servers (GCS, raylet, workers, agents) listen on loopback only.
    """
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


@contextlib.contextmanager
def _ray_session(options: RayOptions) -> Iterator[Any]:
    ray = _ray()
    started_here = not ray.is_initialized()
    if started_here:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": options.debug,
                                  "logging_level": logging.DEBUG if options.debug else logging.ERROR,
                                  "configure_logging": options.debug, "ignore_reinit_error": True}
        if options.address:
            kwargs["address"] = options.address
        else:  # a new instance of our own, even where another cluster runs on this machine
            kwargs["address"] = "local"
            kwargs["num_cpus"] = options.workers
        loopback = _on_loopback(options.address)
        if loopback:
            kwargs["_node_ip_address"] = "127.0.0.1"
        handler = signal.getsignal(signal.SIGTERM)
        with warnings.catch_warnings(), (_loopback_node_ip() if loopback else contextlib.nullcontext()):
            warnings.simplefilter("ignore")
            ray.init(**kwargs)
        if callable(handler) and threading.current_thread() is threading.main_thread():
            # ray.init puts its own SIGTERM handler in (it aborts the driver: exit -6, the trials
            # left running); the caller's (the CLI's: an interrupt) is the one that records them
            signal.signal(signal.SIGTERM, handler)
    try:
        yield ray
    finally:
        if started_here:
            ray.shutdown()


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
        return ASHAScheduler(time_attr="epoch", metric=_METRIC, mode=mode, max_t=epochs,
                             grace_period=1, reduction_factor=2, stop_last_trials=False)
    if options.scheduler == "pbt":
        mutations: dict[str, Any] = {p.name: ladder(p) for p in settings.space.params
                                     if p.name in PERTURBABLE}
        if not mutations:
            raise ConfigError("scheduler='pbt' perturbs lr, weight_decay, momentum or dropout; the "
                              f"space searches none of them (it has: {', '.join(settings.space.names) or 'none'}).")
        return pbt_class()(time_attr="epoch", metric=_METRIC, mode=mode,
                            perturbation_interval=options.perturbation_interval,
                            hyperparam_mutations=mutations,
                            # at least two members explore in each round
                            quantile_fraction=0.25 if population >= 8 else 0.5,
                            resample_probability=0.0, synch=True, require_attrs=False,
                            seed=settings.seed)
    return FIFOScheduler()


def run_ray(settings: SearchSettings, options: RayOptions, *, storage: Any, store: Store,
            deadline: float | None = None, finished: int = 0,
            on_ended: Callable[[], None] | None = None) -> dict[str, Any]:
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
    folder = _experiment_dir(settings, options)
    out: dict[str, Any] = {"backend": "ray", "scheduler": options.scheduler, "experiment": str(folder),
                           "trials_run": 0, "retries": 0, "schedule": {}}
    if remaining == 0:
        return out
    if pbt and tune.Tuner.can_restore(str(folder)):
        # a killed PBT experiment starts its population again, in a folder of its own: restored, its
        # members' checkpoint records name checkpoints deleted after Ray's last save of them, and
        # the synchronous population waits forever for the member whose save failed
        folder = _next_folder(folder)
        out["experiment"] = str(folder)
    # trials left RUNNING by a driver of this host that was killed: failed, their params queued
    # again (a resumed experiment's searcher asks for them first)
    reap_dead_trials(optuna.load_study(study_name=settings.study, storage=storage), store)
    store.reap_stale()
    with _ray_session(options):
        recorder = _Recorder(settings, store, options.scheduler)
        recorder.on_ended = on_ended
        progress = _callback_class()(recorder)
        trainable = tune.with_resources(
            tune.with_parameters(_trainable, settings=settings, pbt=pbt), {"cpu": 1})
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
        members = population_space(_ray_space(settings.space, start_at_default=True), settings.space, size)
        return tune.Tuner(trainable, param_space=members, tune_config=cfg,
                          run_config=run_config)
    searcher = _searcher_class()(
        recorder, space=_Define(settings.space), metric=[f"{_METRIC}_{i}" for i in range(len(settings.objectives))]
        if len(settings.objectives) > 1 else f"{_METRIC}_0",
        mode=["max" if o.direction == "maximize" else "min" for o in settings.objectives]
        if len(settings.objectives) > 1 else ("max" if settings.objectives[0].direction == "maximize" else "min"),
        sampler=make_sampler(settings), study_name=settings.study, storage=storage)
    from ray.tune.search import ConcurrencyLimiter

    cfg = tune.TuneConfig(search_alg=ConcurrencyLimiter(searcher, max_concurrent=options.workers),
                          scheduler=_scheduler(settings, options), num_samples=remaining,
                          time_budget_s=time_budget, reuse_actors=True)
    return tune.Tuner(trainable, tune_config=cfg, run_config=run_config)


