"""The run store: runs, environment, fingerprint, concurrency, crash marking, bad databases."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import proftune
from proftune.exceptions import ConfigError, StoreError
from proftune.track import Store, data_fingerprint, environment


def test_run_lifecycle(db_url: str) -> None:
    store = Store(db_url)
    with store.track("train", "t", config={"lr": 0.1}) as run:
        run.set(metrics={"accuracy": 0.9}, curves={"epoch": [{"epoch": 1}]})
    rec = store.get_run(run.id)
    assert rec.status == "finished"
    assert rec.metrics == {"accuracy": 0.9}
    assert rec.ended_at is not None
    assert rec.duration_s is not None
    assert rec.duration_s >= 0


def test_failed_run_keeps_error(db_url: str) -> None:
    store = Store(db_url)
    with pytest.raises(RuntimeError), store.track("train", "t", config={}) as run:
        raise RuntimeError("boom")
    rec = store.get_run(run.id)
    assert rec.status == "failed"
    assert "RuntimeError: boom" in (rec.error or "")


def test_environment_fields() -> None:
    env = environment("cpu")
    for key in ("python", "torch", "cuda", "cudnn", "device", "cpu", "cores", "memory_bytes", "git_commit"):
        assert key in env
    assert env["torch"] == torch.__version__
    assert env["cores"] == os.cpu_count()


def test_fingerprint_detects_one_changed_sample() -> None:
    task = proftune.load_task("wine-mlp")
    a, b = data_fingerprint(task), data_fingerprint(task)
    assert a == b
    assert len(a) == 32

    from proftune.examples import TensorBatches
    from proftune.examples._sklearn import load_split

    x, y, _, _ = load_split("wine")
    x2 = x.clone()
    x2[17, 3] += 1e-3

    class Changed(type(task)):  # type: ignore[misc]
        def train_data(self, batch_size, params):  # type: ignore[no-untyped-def]
            return TensorBatches(x2, y, batch_size, shuffle=True)

    assert data_fingerprint(Changed()) != a
    # fingerprinting leaves the global RNG where it was
    torch.manual_seed(3)
    expected = torch.rand(1)
    torch.manual_seed(3)
    data_fingerprint(task)
    assert torch.equal(torch.rand(1), expected)


def test_not_a_database_left_untouched(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_bytes(b"my precious notes\n" * 10)
    before = hashlib.sha256(f.read_bytes()).hexdigest()
    with pytest.raises(StoreError) as err:
        Store(f"sqlite:///{f}")
    assert str(err.value).startswith(f"db='sqlite:///{f}': {str(f)!r} exists and is not a SQLite database")
    assert hashlib.sha256(f.read_bytes()).hexdigest() == before
    assert not (tmp_path / "notes.txt-wal").exists()


def test_bad_url() -> None:
    """The message names the URL as the public functions take it (db=); the CLI reads --db."""
    with pytest.raises(StoreError, match=r"^db='this is not a url' is not a database URL"):
        Store("this is not a url")


def test_a_path_to_a_sqlite_file_is_its_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--db runs.db`` (what a user types) opens that file, relative to the working folder."""
    monkeypatch.chdir(tmp_path)
    store = Store("runs.db")
    assert store.url == f"sqlite:///{tmp_path / 'runs.db'}"
    rid = store.start_run("train", "digits-mlp")
    assert Store(str(tmp_path / "runs.db")).get_run(rid).kind == "train"
    assert (tmp_path / "runs.db").exists()


WRITER = textwrap.dedent(
    """
    import sys
    from proftune.track import Store
    store = Store(sys.argv[1])
    for i in range(50):
        run = store.start_run("train", "w" + sys.argv[2], config={"i": i})
        store.finish_run(run, metrics={"i": i})
    """
)


def test_two_processes_write_50_runs_each(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    Store(url)  # create the schema first, as the first command on a machine would
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    procs = [subprocess.Popen([sys.executable, str(script), url, str(k)]) for k in range(2)]
    assert [p.wait(timeout=180) for p in procs] == [0, 0]
    store = Store(url)
    assert store.count_runs() == 100
    assert len(store.list_runs(status="finished")) == 100
    assert len(store.list_runs(task="w0")) == 50
    assert len(store.list_runs(task="w1")) == 50


def test_killed_run_is_marked_failed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    code = (
        "import os, sys\nfrom proftune.track import Store\n"
        f"s = Store({url!r}); s.start_run('train', 'victim')\nos._exit(9)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=False, timeout=120)
    store = Store(url)
    assert store.list_runs()[0].status == "running"
    assert store.reap_stale() == 1
    rec = store.list_runs()[0]
    assert rec.status == "failed"
    assert "without finishing" in (rec.error or "")


def test_compare(db_url: str) -> None:
    store = Store(db_url)
    a = store.start_run("train", "t", config={"lr": 0.1, "bs": 32}, data_fingerprint="a" * 32,
                        env={"torch": "2.0"})
    store.finish_run(a, metrics={"accuracy": 0.9})
    b = store.start_run("train", "t", config={"lr": 0.2, "bs": 32}, data_fingerprint="a" * 32,
                        env={"torch": "2.1"})
    store.finish_run(b, metrics={"accuracy": 0.95})
    diff = store.compare(a, b)
    assert diff["config"] == {"lr": {"a": 0.1, "b": 0.2}}
    assert diff["env"] == {"torch": {"a": "2.0", "b": "2.1"}}
    assert diff["data_fingerprint"]["match"] is True
    assert diff["metrics"]["accuracy"]["delta"] == pytest.approx(0.05)


def test_a_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    import sqlite3

    f = tmp_path / "app.db"
    conn = sqlite3.connect(f)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers VALUES (1, 'ada')")
    conn.commit()
    conn.close()
    before = hashlib.sha256(f.read_bytes()).hexdigest()
    with pytest.raises(StoreError, match=r"another application's tables \(customers\)"):
        Store(f"sqlite:///{f}")
    assert hashlib.sha256(f.read_bytes()).hexdigest() == before  # no tables added, still a rollback journal
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no -wal, no -shm
    conn = sqlite3.connect(f)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()


def test_empty_new_optuna_and_proftune_databases_are_opened(tmp_path: Path) -> None:
    import optuna

    (tmp_path / "empty.db").write_bytes(b"")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    optuna.create_study(storage=f"sqlite:///{tmp_path / 'optuna.db'}", study_name="s")
    for name in ("empty.db", "new.db", "optuna.db"):
        Store(f"sqlite:///{tmp_path / name}").start_run("train", "t")
    assert Store(f"sqlite:///{tmp_path / 'new.db'}").count_runs() == 1  # and again: it is ours now


def test_a_password_in_the_url_is_never_shown(tmp_path: Path) -> None:
    from proftune.track import redact_url

    url = "postgresql+psycopg2://user:s3cret-pw@127.0.0.1:1/db"
    with pytest.raises(StoreError) as err:
        Store(url)
    assert "s3cret-pw" not in str(err.value)
    assert "user:***@127.0.0.1" in str(err.value)
    with pytest.raises(StoreError) as err:
        Store("postgresql//user:s3cret-pw@host/db")  # not even a URL
    assert "s3cret-pw" not in str(err.value)
    assert redact_url(url) == "postgresql+psycopg2://user:***@127.0.0.1:1/db"


def test_compare_names_every_missing_run(db_url: str) -> None:
    store = Store(db_url)
    a = store.start_run("train", "t")
    with pytest.raises(ConfigError, match="runs 999998, 999999 do not exist"):
        store.compare(999998, 999999)
    with pytest.raises(ConfigError, match="run 999999 does not exist"):
        store.compare(a, 999999)


def test_a_store_whose_schema_is_there_is_opened_without_creating_it_again(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A search opens a Store per chunk and per worker: checking every table and index again cost
    30 ms each time (issue 60); one read of the schema's names tells whether they are all there."""
    from proftune.track import _store

    url = f"sqlite:///{tmp_path / 'p.db'}"
    Store(url)
    created: list[str] = []
    real = _store._metadata.create_all
    monkeypatch.setattr(_store._metadata, "create_all", lambda *a, **k: (created.append("x"), real(*a, **k)))
    store = Store(url)
    assert created == []
    with store.track("train", "t") as run:
        run.set(metrics={"accuracy": 0.5})
    assert store.get_run(run.id).metrics == {"accuracy": 0.5}
    # a store without one of its indexes (made by an older version) is completed as before
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DROP INDEX {next(iter(_store.runs_table.indexes)).name}")
    Store(url)
    assert created == ["x"]
    Store(f"sqlite:///{tmp_path / 'new.db'}")  # a new file: made
    assert created == ["x", "x"]
