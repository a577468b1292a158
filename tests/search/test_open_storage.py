"""Optuna's storage on the store's database is opened once a process: the optimize loop's search
calls ``search`` once a chunk of trials, and each opening checked the schema (0.25-0.3 s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proftune.search._storage import open_storage
from proftune.track import Store


def test_one_storage_per_database_file_and_a_new_one_for_a_replaced_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    Store(url)
    first = open_storage(url)
    assert open_storage(url) is first
    other = f"sqlite:///{tmp_path / 'q.db'}"
    Store(other)
    assert open_storage(other) is not first
    # the file replaced under the same URL is another database: never the old engine's connections
    first.engine.dispose()
    (tmp_path / "p.db").rename(tmp_path / "old.db")
    Store(url)
    again = open_storage(url)
    assert again is not first
    assert open_storage(url) is again


def test_a_new_database_is_in_wal_mode_from_optunas_first_statement(tmp_path: Path, monkeypatch: Any) -> None:
    """Optuna's constructor creates its tables on connections already in the Store's mode (WAL,
    synchronous=NORMAL), not in SQLite's default (a flush to disk per table): no Store made the file
    first, and the storage's later connections are in the same mode."""
    from optuna.storages._rdb import models

    seen: list[tuple[str, int]] = []
    real = models.BaseModel.metadata.create_all

    def create_all(bind: Any, *args: Any, **kwargs: Any) -> None:
        with bind.connect() as conn:
            raw = conn.connection.dbapi_connection
            seen.append((raw.execute("PRAGMA journal_mode").fetchone()[0],
                         raw.execute("PRAGMA synchronous").fetchone()[0]))
        real(bind, *args, **kwargs)

    monkeypatch.setattr(models.BaseModel.metadata, "create_all", create_all)
    storage = open_storage(f"sqlite:///{tmp_path / 'fresh.db'}")
    assert seen == [("wal", 1)]  # 1: NORMAL
    with storage.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert (raw.execute("PRAGMA journal_mode").fetchone()[0], raw.execute("PRAGMA synchronous").fetchone()[0]) \
            == ("wal", 1)
        assert {"studies", "trials", "alembic_version"} <= {
            r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_new_databases_share_one_alembic_script_directory(tmp_path: Path, monkeypatch: Any) -> None:
    """Alembic's revision files are parsed once a process, not three times a new database; each new
    database is still stamped at Optuna's head revision."""
    import alembic.script

    built: list[Any] = []
    real = alembic.script.ScriptDirectory.from_config

    def counted(config: Any) -> Any:
        built.append(config)
        return real(config)

    monkeypatch.setattr(alembic.script.ScriptDirectory, "from_config", counted)
    heads = []
    for name in ("a.db", "b.db", "c.db"):
        storage = open_storage(f"sqlite:///{tmp_path / name}")
        heads.append(storage._version_manager.get_current_version())
    assert len(built) <= 1  # none where an earlier test of this process built it
    assert heads[0] == heads[1] == heads[2] == storage._version_manager.get_head_version()


def test_the_studies_of_a_process_share_one_trial_cache_which_sees_every_change(tmp_path: Path) -> None:
    """Every Study object on a storage that ``open_storage`` keeps reads through one Optuna trial
    cache (a search call made three, each reading the whole study): a trial told through one is
    seen finished through another, and a trial another process changed is read again."""
    import optuna

    from proftune.search._storage import shared

    url = f"sqlite:///{tmp_path / 'p.db'}"
    Store(url)
    storage = open_storage(url)
    assert shared(storage) is shared(storage)
    mine = optuna.create_study(study_name="s", storage=shared(storage))
    trial = mine.ask()
    trial.suggest_float("x", 0.0, 1.0)
    other = optuna.load_study(study_name="s", storage=shared(storage))
    assert [t.state for t in other.get_trials()] == [optuna.trial.TrialState.RUNNING]
    mine.tell(trial, 0.5)
    assert [(t.state, t.value) for t in other.get_trials()] == [(optuna.trial.TrialState.COMPLETE, 0.5)]
    # another process's Optuna (a storage of its own) enqueues and takes a trial: read here too
    elsewhere = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(url))
    elsewhere.enqueue_trial({"x": 0.25})
    assert [t.state.name for t in other.get_trials()] == ["COMPLETE", "WAITING"]
    t2 = elsewhere.ask()
    elsewhere.tell(t2, 0.25)
    assert [(t.number, t.value) for t in other.get_trials()] == [(0, 0.5), (1, 0.25)]
    # a storage that open_storage does not keep is given as it is (Optuna caches it per Study)
    own = optuna.storages.RDBStorage(url)
    assert shared(own) is own


def test_the_narrow_pop_takes_the_queued_trials_in_optunas_order(tmp_path: Path) -> None:
    """The queue's pop by one narrow query: the waiting trials by number, each the first process
    to set it running takes; one already taken elsewhere is passed over, as Optuna does. Trials
    another process queued (unknown to this process's Optuna cache) take their params as well."""
    import optuna

    from proftune.search._storage import narrow_pop, shared

    url = f"sqlite:///{tmp_path / 'p.db'}"
    Store(url)
    study = optuna.create_study(study_name="s", storage=shared(open_storage(url)),
                                sampler=optuna.samplers.RandomSampler(seed=0))
    elsewhere = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(url))
    for x in (0.1, 0.2, 0.3):
        elsewhere.enqueue_trial({"x": x})
    elsewhere.ask()  # took trial 0
    assert elsewhere.get_trials()[0].state.name == "RUNNING"
    narrow_pop(study)
    got = [study.ask() for _ in range(3)]
    assert [t.number for t in got] == [1, 2, 3]
    assert [t.suggest_float("x", 0.0, 1.0) for t in got[:2]] == [0.2, 0.3]
    assert [t.params for t in study.get_trials()[1:3]] == [{"x": 0.2}, {"x": 0.3}]
    assert study.get_trials()[3].system_attrs.get("fixed_params") is None  # a new trial: the queue was empty


def test_a_calls_queue_is_written_in_one_transaction_as_optuna_writes_each(tmp_path: Path) -> None:
    """``enqueue_all`` leaves the study as ``enqueue_trial`` one at a time does: the same numbers,
    fixed params, user attributes and states, in order."""
    import optuna

    from proftune.search._storage import enqueue_all, shared

    url = f"sqlite:///{tmp_path / 'p.db'}"
    Store(url)
    items = [({"x": 0.1 * i, "k": "a"}, {"proftune_tags": {"i": i}, **({"proftune_repeat": 1} if i else {})})
             for i in range(4)]
    seen = []
    for name, put in (("one", lambda st: [st.enqueue_trial(p, skip_if_exists=False, user_attrs=a) for p, a in items]),
                      ("all", lambda st: enqueue_all(st, items))):
        study = optuna.create_study(study_name=name, storage=shared(open_storage(url)))
        study.enqueue_trial({"x": 0.9})  # one before: the numbers go on from it
        put(study)
        seen.append([(t.number, t.state.name, t.system_attrs, t.user_attrs) for t in study.get_trials()])
    assert seen[0] == seen[1]
    assert [n for n, *_ in seen[1]] == [0, 1, 2, 3, 4]


def test_without_optunas_private_modules_the_public_path_writes_the_same_study(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``optuna>=4.0`` is allowed, and the shared cache and the one-transaction queue use Optuna's
    private modules: where those cannot be imported, each Study keeps its own cache and the queue is
    written one trial at a time, to the same study."""
    import sys

    import optuna

    from proftune.search._storage import enqueue_all, shared

    url = f"sqlite:///{tmp_path / 'p.db'}"
    Store(url)
    items = [({"x": 0.1 * i}, {"proftune_tags": {"i": i}}) for i in range(3)]
    seen = []
    for name, hide in (("private", False), ("public", True)):
        with monkeypatch.context() as m:
            if hide:  # an import of a module set to None raises ImportError
                m.setitem(sys.modules, "optuna.storages._cached_storage", None)
                m.setitem(sys.modules, "optuna.storages._rdb.models", None)
            storage = open_storage(url)
            assert (shared(storage) is storage) == hide
            study = optuna.create_study(study_name=name, storage=shared(storage))
            enqueue_all(study, items)
            seen.append([(t.number, t.state.name, t.system_attrs, t.user_attrs) for t in study.get_trials()])
    assert seen[0] == seen[1]
    assert len(seen[1]) == 3


def test_a_trial_read_in_plain_statements_is_optunas_own_read(tmp_path: Path) -> None:
    """Every kind of trial (queued, running, complete with two values, pruned with intermediate
    values, failed; inf and nan among the values) reads the same through the storage's plain
    statements as through Optuna's ORM read; a missing trial is Optuna's KeyError."""
    import math

    import optuna
    from optuna.storages import RDBStorage

    url = f"sqlite:///{tmp_path / 'p.db'}"
    Store(url)
    storage = open_storage(url)
    assert type(storage) is not RDBStorage  # the fast reader is in use on this Optuna
    study = optuna.create_study(storage=storage, study_name="s", directions=["maximize", "minimize"])
    study.enqueue_trial({"x": 0.5, "c": "b"}, user_attrs={"tags": {"k": [1, 2]}})
    done = study.ask()
    done.suggest_float("x", 0.0, 1.0)
    done.suggest_categorical("c", ["a", "b"])
    done.suggest_int("n", 1, 9, log=True)
    done.set_user_attr("record", {"state": "complete", "curve": [0.1, float("nan")]})
    study.tell(done, [float("inf"), -1.5])
    for state in (optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL):
        t = study.ask()
        t.suggest_float("x", 0.0, 1.0)
        for step, value in ((1, float("nan")), (2, float("-inf")), (3, 0.25)):  # report() is single-objective
            storage.set_trial_intermediate_value(t._trial_id, step, value)
        study.tell(t, state=state)
    study.ask().set_user_attr("running", True)
    study.enqueue_trial({"x": 0.1})
    plain = RDBStorage.get_trial
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 5
    for t in trials:
        ours, optunas = storage.get_trial(t._trial_id), plain(storage, t._trial_id)
        assert repr(ours) == repr(optunas)  # nan-safe: every field, in Optuna's order
        assert ours.datetime_start == optunas.datetime_start
        assert ours.state == optunas.state
    assert math.isnan(storage.get_trial(trials[1]._trial_id).intermediate_values[1])
    with pytest.raises(KeyError):
        storage.get_trial(10_000)
    with pytest.raises(KeyError):
        plain(storage, 10_000)


def test_a_queue_written_in_plain_statements_leaves_the_rows_optuna_writes(tmp_path: Path) -> None:
    """``enqueue_all``'s own statements leave every row of the database as Optuna's
    ``enqueue_trial`` one at a time does (trials, their user and system attributes, in order), after
    a trial of another study between them: the numbers count the study's own trials."""
    import optuna
    import sqlalchemy as sa

    from proftune.search._storage import enqueue_all, shared

    items = [({"x": 0.1 * i, "k": "a"}, {"proftune_tags": {"i": i, "s": "é"}, **({"proftune_repeat": 1} if i else {})})
             for i in range(4)]
    dumps = []
    for way in ("one", "all"):
        url = f"sqlite:///{tmp_path / f'{way}.db'}"
        Store(url)
        storage = open_storage(url)
        other = optuna.create_study(study_name="other", storage=shared(storage))
        study = optuna.create_study(study_name="s", storage=shared(storage))
        study.enqueue_trial({"x": 0.9})
        other.enqueue_trial({"x": 0.5})
        if way == "one":
            for p, a in items:
                study.enqueue_trial(p, skip_if_exists=False, user_attrs=a)
        else:
            enqueue_all(study, items)
        assert [t.number for t in study.get_trials()] == [0, 1, 2, 3, 4]
        with storage.engine.connect() as conn:
            dumps.append({table: conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY 1")).all()
                          for table in ("trials", "trial_user_attributes", "trial_system_attributes",
                                        "trial_params", "trial_values")})
    assert dumps[0] == dumps[1]
    assert len(dumps[1]["trials"]) == 6
    assert len(dumps[1]["trial_user_attributes"]) == 7
