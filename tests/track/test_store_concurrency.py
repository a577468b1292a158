"""The store never drops SQLite's locks: opening a Store while a connection lives in the process
leaves that connection's lock held, so another process's close cannot reset the WAL under it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from proftune.track import Store

READ = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "print(c.execute('SELECT count(*) FROM t').fetchone()[0]); c.close()")


def _read_elsewhere(path: Path) -> int:
    """A plain sqlite3 reader in another process (it checkpoints and removes the WAL on close when
    it thinks it is the last connection)."""
    out = subprocess.run([sys.executable, "-c", READ, str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout)


def test_a_store_opened_beside_a_live_connection_keeps_its_lock(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    Store(f"sqlite:///{path}")
    live = sqlite3.connect(path)  # as Optuna's pooled connection lives through a tune
    live.execute("PRAGMA journal_mode=WAL")
    live.execute("CREATE TABLE t (x INTEGER)")
    live.execute("INSERT INTO t VALUES (1)")
    live.commit()
    wal = Path(f"{path}-wal")
    assert wal.exists()
    Store(f"sqlite:///{path}")  # every command opens one; a plain open()/close() dropped the lock
    assert _read_elsewhere(path) == 1
    # the live connection still holds its SHARED lock: the reader's close was not the last one
    assert wal.exists(), "another process's close removed the WAL under a live connection"
    live.execute("INSERT INTO t VALUES (2)")
    live.commit()
    assert _read_elsewhere(path) == 2
    live.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert check.execute("SELECT count(*) FROM t").fetchone()[0] == 2
    check.close()


def test_a_file_that_is_no_database_is_refused_untouched(tmp_path: Path) -> None:
    import pytest

    from proftune.exceptions import StoreError

    path = tmp_path / "notes.db"
    path.write_bytes(b"my notes, not a database\n" * 100)
    with pytest.raises(StoreError, match="is not a SQLite database; it was left untouched"):
        Store(f"sqlite:///{path}")
    assert path.read_bytes() == b"my notes, not a database\n" * 100


def test_a_bare_postgresql_url_uses_the_installed_driver() -> None:
    import importlib.util

    import sqlalchemy as sa

    from proftune.track._store import installed_driver

    url = installed_driver(sa.make_url("postgresql://u:pw@127.0.0.1:5/db"), "postgresql://u:***@127.0.0.1:5/db")
    expected = "postgresql+psycopg" if importlib.util.find_spec("psycopg") else "postgresql+psycopg2"
    assert url.drivername == expected
    assert url.password == "pw"
    assert url.database == "db"
    kept = installed_driver(sa.make_url("postgresql+psycopg2://u@h/db"), "x")
    assert kept.drivername == "postgresql+psycopg2"


def test_the_documented_postgresql_url_opens_a_store() -> None:
    import os

    import pytest
    import sqlalchemy as sa

    url = os.environ.get("PROFTUNE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("PROFTUNE_TEST_POSTGRES_URL is unset (CI starts a PostgreSQL server and sets it)")
    bare = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    store = Store(bare)
    run = store.start_run("train", "t")
    assert store.get_run(run).status == "running"
