"""A store on a full device (issue 47): one message that says so, with the path and the bytes free,
nothing touched, and no SQL on any store error. The device is filled by SQLite's own limit
(``PRAGMA max_page_count``: SQLITE_FULL, "database or disk is full") and, where this process may
mount one, by a 1 MiB tmpfs."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from proftune.exceptions import StoreError
from proftune.track import Store, _store


def _capped(pages: int) -> Any:
    """The store's connection setup, then the database capped at ``pages`` pages."""
    pragmas = _store.sqlite_pragmas

    def setup(dbapi_conn: Any, record: Any) -> None:
        pragmas(dbapi_conn, record)
        dbapi_conn.execute(f"PRAGMA max_page_count={pages}")

    return setup


def test_a_disk_full_while_the_schema_is_made_says_so_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_store, "sqlite_pragmas", _capped(1))
    with pytest.raises(StoreError) as err:
        Store(f"sqlite:///{tmp_path / 'p.db'}")
    message = str(err.value)
    assert "no space left on the device holding the store" in message
    assert str(tmp_path / "p.db") in message
    assert "bytes free" in message
    assert "CREATE" not in message
    assert "[SQL" not in message
    assert list(tmp_path.iterdir()) == []  # the new store's file and logs are gone again


def test_a_disk_full_at_a_runs_start_says_so_and_writes_nothing(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    store.start_run("train", "t")
    with store.engine.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
    event.listen(store.engine, "connect", lambda c, _r: c.execute(f"PRAGMA max_page_count={pages}"))
    with pytest.raises(StoreError, match="no space left on the device holding the store") as err:
        store.start_run("train", "t", config={"pad": "x" * 200_000})  # needs pages the device has not
    assert "INSERT" not in str(err.value)
    assert [r.status for r in Store(f"sqlite:///{tmp_path / 'p.db'}").list_runs()] == ["running"]


def test_the_cli_shows_no_sql_of_a_database_error(tmp_path: Path) -> None:
    """Any driver error (here a store whose table lost a column) reaches the user as the driver's
    reason, without the statement SQLAlchemy appends."""
    import sqlite3

    db = tmp_path / "p.db"
    Store(f"sqlite:///{db}")
    con = sqlite3.connect(db)
    con.execute("ALTER TABLE proftune_runs DROP COLUMN metrics")
    con.commit()
    con.close()
    out = subprocess.run([sys.executable, "-m", "proftune.cli", "runs", "list", "--db", f"sqlite:///{db}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    assert "the database failed: OperationalError" in out.stderr
    assert "SELECT" not in out.stderr
    assert "[SQL" not in out.stderr


@contextlib.contextmanager
def _tmpfs(folder: Path) -> Iterator[None]:
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here (the injected tests above cover the messages)")
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_a_store_on_a_full_tmpfs_is_refused_untouched(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    with _tmpfs(disk):
        Store(f"sqlite:///{disk / 'p.db'}").start_run("train", "t")
        with contextlib.suppress(OSError), open(disk / "fill", "wb") as f:
            while True:
                f.write(b"\0" * 65536)
        before = {p.name: p.read_bytes() for p in disk.iterdir() if p.name != "fill"}
        out = subprocess.run([sys.executable, "-m", "proftune.cli", "train", "digits-mlp", "--epochs", "1",
                              "--db", f"sqlite:///{disk / 'p.db'}"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        assert "no space left on the device holding the store" in out.stderr
        assert "disk I/O error" not in out.stderr
        assert "SQL" not in out.stderr
        assert {p.name: p.read_bytes() for p in disk.iterdir() if p.name != "fill"} == before


class _DiskFull(sqlite3.OperationalError):
    """A driver error as psycopg2 raises it on PostgreSQL's full disk (SQLSTATE 53100 disk_full),
    a DBAPI error of the engine's driver so that SQLAlchemy wraps it in an OperationalError."""

    pgcode = "53100"


def test_a_server_store_on_a_full_disk_says_so_without_sql(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    run_id = store.start_run("train", "t")
    store.path, store.is_sqlite = None, False  # read as a server's store: no file whose device can be asked
    store.shown_url = "postgresql://proftune@db.example:5432/runs"

    @event.listens_for(store.engine, "before_cursor_execute")
    def full(*args: Any) -> None:
        raise _DiskFull('could not extend file "base/16384/16390": No space left on device\n'
                        "HINT:  Check free disk space.")

    for write in (lambda: store.start_run("train", "t"), lambda: store.finish_run(run_id, status="finished")):
        with pytest.raises(StoreError) as err:
            write()
        message = str(err.value)
        assert "no space left on the device holding the store" in message
        assert "nothing was written" in message
        assert "53100" in message
        assert "db.example" in message
        assert "INSERT" not in message
        assert "UPDATE" not in message
        assert "SELECT" not in message
    event.remove(store.engine, "before_cursor_execute", full)
    assert store.get_run(run_id).status == "running"  # untouched
