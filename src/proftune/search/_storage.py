"""Optuna's RDB storage on the Store's database, and finding the trials of processes that died."""

from __future__ import annotations

import contextlib
import copy
import datetime
import os
import socket
import sqlite3
import threading
import time
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import optuna
import sqlalchemy as sa
from optuna.storages import BaseStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from .._jsonsafe import json_dumps
from ..exceptions import ProftuneError
from ..track import Store, pid_alive
from ..track import sqlite_pragmas as _sqlite_pragmas
from ._records import study_view

__all__ = [
    "enqueue_all",
    "fail_if_running",
    "fail_interrupted",
    "interrupt_trials",
    "narrow_pop",
    "open_storage",
    "prepare_storage",
    "reap_dead_trials",
    "retry_callback",
    "shared",
]

_T = TypeVar("_T")

HEARTBEAT_INTERVAL_S = 5
GRACE_PERIOD_S = 30
MAX_RETRY = 2


#: Storages opened in this process, newest last (a few: one store is the common case).
_OPEN: OrderedDict[tuple[Any, ...], RDBStorage] = OrderedDict()
_OPEN_MAX = 4


def _sqlite_file_id(url: str) -> tuple[int, int] | None:
    """The SQLite file's (device, inode): a file replaced under the same URL is another database."""
    try:
        path = sa.engine.make_url(url).database
        if not path or path == ":memory:":
            return None
        st = os.stat(path)
    except (OSError, ValueError, sa.exc.ArgumentError):
        return None
    return st.st_dev, st.st_ino


def open_storage(url: str, *, heartbeat: bool | None = None) -> RDBStorage:
    """Optuna's RDB storage on the Store's database (same URL, same file), opened once per process.

    Opening one checks Optuna's schema against alembic's revision files: 0.25-0.3 s, paid by every
    ``search`` call and again by its workers; the optimize loop's search calls it once a chunk of
    trials (a second of them), so it took a fifth of a small task's search. The storage is kept
    per URL, process and database file (a file replaced under the URL is opened anew).

    ``heartbeat`` (default: on for server databases, off for SQLite): Optuna's heartbeat marks a
    trial whose process stopped beating failed after ``GRACE_PERIOD_S`` and re-enqueues its
    configuration; that is how a trial killed on another machine is found. SQLite lives on one
    machine, where :func:`reap_dead_trials` finds a killed trial at once from its Run's process
    id, so SQLite studies skip the heartbeat's 20-30 ms per trial.
    """
    is_sqlite = url.startswith("sqlite")
    if heartbeat is None:
        heartbeat = not is_sqlite
    key = (url, heartbeat, os.getpid(), _sqlite_file_id(url) if is_sqlite else None)
    if key[3] is not None or not is_sqlite:
        cached = _OPEN.get(key)
        if cached is not None:
            _OPEN.move_to_end(key)
            return cached
    storage = _open(url, heartbeat=heartbeat, is_sqlite=is_sqlite)
    key = (url, heartbeat, os.getpid(), _sqlite_file_id(url) if is_sqlite else None)  # the file exists now
    if key[3] is not None or not is_sqlite:
        _OPEN[key] = storage
        while len(_OPEN) > _OPEN_MAX:
            _, old = _OPEN.popitem(last=False)
            _CACHES.pop(id(old), None)
            old.engine.dispose()
    return storage


#: One Optuna trial cache per storage that :func:`open_storage` keeps open, by the storage's id.
_CACHES: dict[int, tuple[RDBStorage, BaseStorage]] = {}


def shared(storage: BaseStorage) -> BaseStorage:
    """What to give ``optuna.load_study`` and ``optuna.create_study`` for ``storage``: one Optuna
    trial cache for every Study object of this process on it, where :func:`open_storage` keeps it.

    Optuna wraps an RDB storage in a new cache per Study object, which reads every trial of the
    study in full at its first look (the queue's pop, the analysis): a search call made three
    (its own, the worker loop's, the analysis's), each reading the whole study again: a cost that
    grew with the study. The cache keeps finished trials only (Optuna refuses to change one) and
    reads those open or created since its last look, so one shared cache reads each trial once as
    it ends.
    Any other storage (a caller's own, in memory) is given as it is."""
    try:  # Optuna's private cache (``optuna>=4.0`` has it); without it each Study has its own, as before
        from optuna.storages._cached_storage import _CachedStorage
    except ImportError:
        return storage
    if not isinstance(storage, RDBStorage) or not any(v is storage for v in _OPEN.values()):
        return storage
    held = _CACHES.get(id(storage))
    if held is None or held[0] is not storage:
        held = _CACHES[id(storage)] = (storage, _CachedStorage(storage))
    return held[1]


class _PragmaConnection(sqlite3.Connection):
    """A SQLite connection in the Store's mode (WAL, ``synchronous=NORMAL``, a busy timeout) from its
    first statement: an engine's connect listener, added once Optuna's constructor has returned,
    left that constructor's 13 table creations and schema stamp each waiting for a flush to disk
    (0.3-0.4 s of a new study, beside about 0.05 s in WAL mode)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _sqlite_pragmas(self, None)


_SCRIPT_LOCK = threading.Lock()


def _share_alembic_script() -> None:
    """Have Optuna build alembic's script directory once per process, not three times a new database.

    Opening a new database stamps Optuna's schema, checks it and reads its head revision, each time
    from a new ``ScriptDirectory`` that parses every revision file again (0.25 s of a new study's
    0.3 s on this 2-core machine: a tenth of a 12-trial search of a small model). The directory is
    Optuna's own package's, the same for every URL (the stamp runs on the connection it is given).
    Where Optuna's private ``_VersionManager`` is not as expected, nothing changes.
    """
    from optuna.storages._rdb import storage as rdb

    manager = getattr(rdb, "_VersionManager", None)
    build = getattr(manager, "_create_alembic_script", None)
    if manager is None or build is None or getattr(build, "_proftune_shared", False):
        return
    shared: list[Any] = []

    def create_alembic_script(self: Any) -> Any:
        with _SCRIPT_LOCK:
            if not shared:
                shared.append(build(self))
            return shared[0]

    create_alembic_script._proftune_shared = True  # type: ignore[attr-defined]
    manager._create_alembic_script = create_alembic_script


def _open(url: str, *, heartbeat: bool, is_sqlite: bool) -> RDBStorage:
    _share_alembic_script()
    kwargs: dict[str, object] = ({"connect_args": {"timeout": 60, "factory": _PragmaConnection}} if is_sqlite
                                 else {"pool_pre_ping": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = _retry_locked(lambda: _Storage(
            url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_INTERVAL_S if heartbeat else None,
            grace_period=GRACE_PERIOD_S if heartbeat else None,
            heartbeat_stale_trial_callback=retry_callback() if heartbeat else None))
    return storage


#: The collections Optuna's ``_build_frozen_trial_from_trial_model`` reads of a trial.
_CHILDREN = ("params", "values", "user_attributes", "system_attributes", "intermediate_values")


class _Row:
    """A trial's row as Optuna's builder reads it: its columns through a transient ``TrialModel``
    (the model's own properties: Optuna 5 keeps times in UTC and gives local ones), its collections
    as read, one namespace per row (attribute names as the models map their columns)."""

    def __init__(self, model: Any, children: dict[str, list[Any]]) -> None:
        self._model = model
        self.__dict__.update(children)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class _Storage(RDBStorage):
    """Optuna's RDB storage, reading one trial (``get_trial``, twice a trial: its ask and its tell)
    in six plain statements of one transaction, the rows built into its ``FrozenTrial`` by Optuna's
    own code: the ORM's query and five lazy loads cost 4-9 ms a read on this 2-core machine, these
    about half. Where Optuna's private models are not as expected, Optuna's own read."""

    def get_trial(self, trial_id: int) -> optuna.trial.FrozenTrial:
        reader = _trial_reader()
        if reader is None:
            return super().get_trial(trial_id)
        try:
            with self.engine.connect() as conn:  # one transaction: the rows of one moment
                found = reader.read(conn, trial_id)
        except sa.exc.SQLAlchemyError as exc:  # as Optuna's session reports a failed read
            raise optuna.exceptions.StorageInternalError(f"reading trial {trial_id} failed: {exc}") from exc
        if found is None:
            raise KeyError(reader.not_found)
        return self._build_frozen_trial_from_trial_model(found)  # type: ignore[arg-type]  # reads attributes only


class _TrialReader:
    """The statements and column maps of :meth:`_Storage.get_trial`, built once per process."""

    def __init__(self, models: Any) -> None:
        mapper = sa.inspect(models.TrialModel).mapper
        self.model = models.TrialModel
        self.not_found = models.NOT_FOUND_MSG
        self.columns = [(prop.key, prop.columns[0]) for prop in mapper.column_attrs]
        table = mapper.local_table
        self.trial = sa.select(table).where(table.c.trial_id == sa.bindparam("tid"))
        self.children = []
        for name in _CHILDREN:
            child = mapper.relationships[name].mapper
            t = child.local_table
            # no ORDER BY, as the ORM's lazy load: the database's own order (SQLite: by the unique
            # index on trial and key), which Optuna's dicts keep
            stmt = sa.select(t).where(t.c.trial_id == sa.bindparam("tid"))
            self.children.append((name, stmt, [(prop.key, prop.columns[0]) for prop in child.column_attrs]))

    def read(self, conn: sa.Connection, trial_id: int) -> _Row | None:
        row = conn.execute(self.trial, {"tid": trial_id}).one_or_none()
        if row is None:
            return None
        model = self.model()
        for key, column in self.columns:
            setattr(model, key, row._mapping[column])
        children = {}
        for name, stmt, columns in self.children:
            children[name] = [types.SimpleNamespace(**{key: r._mapping[column] for key, column in columns})
                              for r in conn.execute(stmt, {"tid": trial_id})]
        return _Row(model, children)


_READER: list[_TrialReader | None] = []


def _trial_reader() -> _TrialReader | None:
    """The reader of :class:`_Storage`, or None where Optuna's private models differ from those it
    was written for (then Optuna reads, as before)."""
    if not _READER:
        try:
            from optuna.storages._rdb import models

            reader: _TrialReader | None = _TrialReader(models)
            if not hasattr(RDBStorage, "_build_frozen_trial_from_trial_model"):
                reader = None
        except (ImportError, AttributeError, KeyError, sa.exc.SQLAlchemyError):
            reader = None
        _READER.append(reader)
    return _READER[0]


_WAITING = sa.text("SELECT trial_id FROM trials WHERE study_id = :sid AND state = 'WAITING' ORDER BY number")


def narrow_pop(study: optuna.Study) -> None:
    """Have ``study`` take its next queued trial as Optuna does (the waiting trials by number, the
    first this process sets running), finding them by one narrow query: Optuna reads every waiting,
    running and new trial in full (six queries, 3.4 of the ask's 6.8 ms CPU on this machine), then
    reads the trial it took again. Where the study's Optuna cache does not know a waiting trial yet
    (another process or one transaction queued it; the cache writes a param only of a trial it
    knows), Optuna's own pop runs, and its read makes them known. Only where the study is on an RDB
    storage through Optuna's cache, as Optuna opens one."""
    cache = study._storage
    engine = getattr(getattr(cache, "_backend", None), "engine", None)
    known = getattr(cache, "_trial_id_to_study_id_and_number", None)
    if engine is None or not isinstance(known, dict):
        return
    optunas = study._pop_waiting_trial_id

    def pop() -> int | None:
        with engine.connect() as conn:
            waiting = [int(i) for (i,) in conn.execute(_WAITING, {"sid": study._study_id})]
        if any(trial_id not in known for trial_id in waiting):
            return optunas()
        for trial_id in waiting:
            try:
                if cache.set_trial_state_values(trial_id, state=TrialState.RUNNING):
                    return trial_id
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
        return None

    study._pop_waiting_trial_id = pop  # type: ignore[method-assign]


def enqueue_all(study: optuna.Study, items: list[tuple[dict[str, object], dict[str, object]]]) -> None:
    """``study.enqueue_trial(params, user_attrs=attrs, skip_if_exists=False)`` of each (params, attrs)
    in order, in one transaction on an RDB storage (Optuna writes each trial as it does: its own
    code, in one session): one commit and one lock of the study row, not one per trial (0.7 of
    3.6 ms a trial on this machine), and a call's queue is there whole or not at all."""
    try:  # Optuna's private RDB session and models; without them, one trial at a time as before
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
        private = True
    except ImportError:
        private = False
    backend = getattr(study._storage, "_backend", study._storage)
    prepare = getattr(backend, "_get_prepared_new_trial", None)
    if not private or not isinstance(backend, RDBStorage) or prepare is None or len(items) < 2:
        for params, attrs in items:
            study.enqueue_trial(params, skip_if_exists=False, user_attrs=attrs)
        return
    templates = [optuna.trial.create_trial(state=TrialState.WAITING, system_attrs={"fixed_params": params},
                                           user_attrs=attrs) for params, attrs in items]
    for template in templates:
        template._validate()
    made = _insert_waiting(backend, study._study_id, templates)
    if made is None:  # a template with more than attributes: Optuna's own code writes each
        made = []
        with _create_scoped_session(backend.scoped_session) as session:
            models.StudyModel.find_or_raise_by_id(study._study_id, session, for_update=True)
            for template in templates:
                row = prepare(study._study_id, template, session)
                frozen = copy.deepcopy(template)  # as Optuna's create_new_trial hands its cache the trial
                frozen.number, frozen._trial_id = row.number, row.trial_id
                made.append(frozen)
    add = getattr(study._storage, "_add_trials_to_cache", None)
    if add is not None:  # known to the study's cache, as one at a time: the pop takes them narrowly
        with study._storage._lock:  # type: ignore[attr-defined]
            add(study._study_id, made)


def _insert_waiting(backend: RDBStorage, study_id: int,
                    templates: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial] | None:
    """The rows Optuna's ``_get_prepared_new_trial`` writes for queued trials that have only
    attributes (a trial, its user then its system attributes, its number: the study's trials before
    it), as plain statements in one transaction with the study's row locked as Optuna locks it: the
    ORM's nine statements a trial (a read of the trial before each attribute) cost 5-17 ms a trial
    on this 2-core machine, these about a third. None where a template has more (params, values,
    times): then Optuna's code. Returns each template as Optuna's cache is handed it."""
    if any(t.params or t.values is not None or t.intermediate_values or t.datetime_start is not None
           or t.datetime_complete is not None or t.state != TrialState.WAITING for t in templates):
        return None
    from optuna.storages._rdb import models

    trials, studies = models.TrialModel.__table__, models.StudyModel.__table__
    attrs = ((models.TrialUserAttributeModel.__table__, "user_attrs"),
             (models.TrialSystemAttributeModel.__table__, "system_attrs"))
    made = []
    try:
        with backend.engine.begin() as conn:
            lock = sa.select(studies.c.study_id).where(studies.c.study_id == study_id).with_for_update()
            if conn.execute(lock).first() is None:
                raise KeyError(models.NOT_FOUND_MSG)
            for template in templates:
                key = conn.execute(trials.insert().values(
                    study_id=study_id, number=None, state=TrialState.WAITING, datetime_start=None,
                    datetime_complete=None)).inserted_primary_key
                assert key is not None
                trial_id = int(key[0])
                for table, field in attrs:
                    rows = [{"trial_id": trial_id, "key": k, "value_json": json_dumps(v)}
                            for k, v in getattr(template, field).items()]
                    if rows:
                        conn.execute(table.insert(), rows)
                number = int(conn.execute(sa.select(sa.func.count(trials.c.trial_id)).where(
                    trials.c.study_id == study_id, trials.c.trial_id < trial_id)).scalar_one())
                conn.execute(trials.update().where(trials.c.trial_id == trial_id).values(number=number))
                frozen = copy.deepcopy(template)  # as Optuna's create_new_trial hands its cache the trial
                frozen.number, frozen._trial_id = number, trial_id
                made.append(frozen)
    except sa.exc.IntegrityError:
        raise
    except sa.exc.SQLAlchemyError as exc:  # as Optuna's session reports a failed commit
        raise optuna.exceptions.StorageInternalError(f"queueing {len(templates)} trials failed: {exc}") from exc
    return made


def prepare_storage(url: str) -> None:
    """Open the study storage on ``url`` now, as the first ``search`` call on it would: a caller
    with a clock (the optimize loop) pays it before the clock starts. On a new database it loads
    alembic and stamps Optuna's schema: 0.3 s on this 2-core machine, 2 s at load 9."""
    open_storage(url)


#: What a trial's user attributes say of its outcome (its record, failed, surplus, gated): never
#: a retry's. The rest (a repeat's count, a neighbour's mark, tags) say what to run, and are kept.
OUTCOME_ATTRS = ("proftune", "proftune_failed", "proftune_surplus", "proftune_gated")


class _Retry(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry, which copies every user attribute of the dead trial to its retry, less its
    outcome: a retry holding the dead trial's record (state, its finished Run) read as a trial that
    ended untold, and a reaper in another process failed it while a live worker ran it."""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        kept = copy.copy(trial)
        kept.user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in OUTCOME_ATTRS}
        super().__call__(study, kept)


def retry_callback() -> RetryHeartbeatStaleTrialCallback:
    """Re-enqueue a stale (killed) trial's configuration, at most ``MAX_RETRY`` times, without the
    dead trial's outcome (:data:`OUTCOME_ATTRS`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _Retry(max_retry=MAX_RETRY)


def _retry_locked(fn: Callable[[], _T], attempts: int = 30) -> _T:
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


def interrupt_trials(study: optuna.Study, store: Store, runs: list[Any], *, why: str) -> list[int]:
    """The trials of ``runs`` (trial Runs a search stopped by Ctrl-C or SIGTERM left running):
    each Run ``interrupted`` with ``why``; each Optuna trial still RUNNING failed (Optuna has no
    interrupted state: the user attribute ``interrupted`` says it) with its configuration enqueued
    again, so running the same command goes on with it (the retry, not itself interrupted, without
    the attribute). Returns the trial numbers failed."""
    import contextlib

    ids = []
    for run in runs:
        number = run.config.get("trial")
        with contextlib.suppress(KeyError, RuntimeError, TypeError, ValueError):
            ids.append(study._storage.get_trial_id_from_study_id_trial_number(study._study_id, int(number)))
        store.finish_run(run.id, status="interrupted", error=why)
    return fail_interrupted(study, ids)


def fail_if_running(study: optuna.Study, trial_id: int) -> bool:
    """Fail the trial only where it is still RUNNING, in one statement; True where this call did.

    Of several workers that found the same dead trial, exactly one fails it and enqueues its retry:
    Optuna's row lock (``for_update``) is a no-op on SQLite, so two workers that both read RUNNING
    both failed it and each enqueued a retry (one left waiting past the budget). A storage with no
    database (in memory) has one process: Optuna's own call is exact there."""
    backend = getattr(study._storage, "_backend", study._storage)
    engine = getattr(backend, "engine", None)
    if engine is None:
        return bool(study._storage.set_trial_state_values(trial_id, state=TrialState.FAIL))
    stmt = sa.text("UPDATE trials SET state = 'FAIL', datetime_complete = :now "
                   "WHERE trial_id = :trial_id AND state = 'RUNNING'")
    now = datetime.datetime.now()  # Optuna's own timestamps are naive local times
    with engine.begin() as conn:
        return bool(conn.execute(stmt, {"now": now, "trial_id": trial_id}).rowcount == 1)


def fail_interrupted(study: optuna.Study, trial_ids: list[int]) -> list[int]:
    """Each of ``trial_ids`` still RUNNING failed with the user attribute ``interrupted`` and its
    configuration enqueued again (the retry, not itself interrupted, without the attribute).
    Returns the trial numbers failed."""
    import contextlib

    retry = retry_callback()
    failed = []
    for trial_id in trial_ids:
        with contextlib.suppress(KeyError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            if study._storage.get_trial(trial_id).state == TrialState.RUNNING:
                study._storage.set_trial_user_attr(trial_id, "interrupted", True)
                if fail_if_running(study, trial_id):
                    frozen = study._storage.get_trial(trial_id)
                    retry(study, frozen)
                    failed.append(frozen.number)
    for queued in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if queued.system_attrs.get("failed_trial") in failed and queued.user_attrs.get("interrupted"):
            study._storage.set_trial_user_attr(queued._trial_id, "interrupted", None)
    return failed


def reap_dead_trials(study: optuna.Study, store: Store) -> list[int]:
    """Fail the RUNNING trials whose process on this host is gone, and enqueue their retry.

    The heartbeat does the same for any machine after ``GRACE_PERIOD_S``; on the same host the
    trial's Run (host, process id) says it at once, so a resumed study does not wait out the
    grace period. Call before :meth:`Store.reap_stale` (which marks those Runs failed).
    """
    host, me = socket.gethostname(), os.getpid()
    reaped = []
    retry = retry_callback()
    for run in store.list_runs(kind="trial", study=study.study_name, status="running"):
        number = run.config.get("trial")
        if (run.host != host or run.pid is None or run.pid == me or pid_alive(int(run.pid))
                or not isinstance(number, int)):
            continue
        try:
            trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, int(number))
            if study._storage.get_trial(trial_id).state != TrialState.RUNNING:
                continue
            ok = fail_if_running(study, trial_id)
        except (KeyError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            continue
        if ok:
            retry(study, study._storage.get_trial(trial_id))
            reaped.append(int(number))
    # the running trials from the study's slot view (one narrow query, read incrementally), each
    # read in full only then: reading every open trial in full cost 15-30 ms a search call
    view = study_view(study)
    for trial_id in [i for i, slot in view.slots.items() if slot.state == "RUNNING"]:
        # ended (its record written, its Run finished) but never told: the database went away
        # between the two, and the process that ran it is gone
        t = study._storage.get_trial(trial_id)
        if t.state != TrialState.RUNNING:
            continue
        rec = t.user_attrs.get("proftune") or {}
        if not rec.get("state") or rec.get("run_id") is None:
            continue
        try:
            run = store.get_run(int(rec["run_id"]))
        except (KeyError, ValueError, ProftuneError):
            continue
        if run.status == "running" or run.host != host or run.pid is None or pid_alive(int(run.pid)):
            continue
        with contextlib.suppress(KeyError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            if fail_if_running(study, t._trial_id):
                retry(study, study._storage.get_trial(t._trial_id))
                reaped.append(t.number)
    return reaped
