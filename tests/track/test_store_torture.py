"""The store under concurrent writers and readers, a bounded run of ``benchmarks/store_torture.py``:
a tune (trials in its own process, as the issue's case) and a train loop write while a plain ``sqlite3`` reader, ``runs
list``'s query and Optuna's storage (what optuna-dashboard reads) read; afterwards the database is
intact and every run and trial the writers reported is in it. The longer variant is the benchmark."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from store_torture import torture

TRIALS, TRAIN_RUNS = 20, 5


def _assert_nothing_lost(result: dict[str, Any], *, integrity: str) -> None:
    assert result["failed"] == [], result["failed"]
    assert result["integrity"] == integrity, result["integrity"]
    assert result["lost"] == [], result["lost"]
    # the writers did what was asked, while the readers read
    said = [r.get("said") for r in result["reports"] if r["role"] == "tune"]
    assert result["trials"] == TRIALS, (result["trials"], said)
    assert result["runs"] == TRAIN_RUNS, result["runs"]
    reads = {r["role"]: r for r in result["reports"] if r["role"].startswith("read-")}
    assert len(reads) == result["readers"], reads
    for role, r in reads.items():
        assert r["reads"] > 0, (role, r)
        assert r["n_errors"] == 0, (role, r["errors"])


def test_sqlite_store_keeps_every_run_under_concurrent_writers_and_readers(tmp_path: Path) -> None:
    result = torture(f"sqlite:///{tmp_path / 'store.db'}", seconds=300, tune_workers=1, trainers=1,
                     trials=TRIALS, train_runs=TRAIN_RUNS)
    assert result["readers"] == 3  # sqlite3, runs list, optuna storage
    _assert_nothing_lost(result, integrity="ok")


def test_postgresql_store_keeps_every_run_under_concurrent_writers_and_readers() -> None:
    url = os.environ.get("PROFTUNE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("PROFTUNE_TEST_POSTGRES_URL is unset (CI starts a PostgreSQL server and sets it)")
    import uuid

    import sqlalchemy as sa

    # a database of its own: the search tests share the server's default one
    name = f"torture_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    try:
        own = sa.make_url(url).set(database=name).render_as_string(hide_password=False)
        result = torture(own, seconds=300, tune_workers=1, trainers=1, trials=TRIALS, train_runs=TRAIN_RUNS)
        assert result["readers"] == 2  # runs list, optuna storage (no sqlite3 on a server)
        _assert_nothing_lost(result, integrity="server")
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()
