"""The store's queries stay cheap as it grows: indexed, in id order, listings without the big columns."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from proftune.exceptions import ConfigError
from proftune.track import Store


def _run(i: int, **over: Any) -> dict[str, Any]:
    run: dict[str, Any] = {
        "kind": ("train", "trial", "profile")[i % 3], "task": ("a", "b")[i % 2], "status": "finished",
        "started_at": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}.000+00:00", "host": "h", "pid": 1,
        "metrics": {"accuracy": i / 100}, "config": {"params": {"lr": 0.1}},
        "curves": {"step": [{"step": s, "loss": 1.0 / (s + 1)} for s in range(50)]},
        "study": f"s{i % 4}" if i % 3 == 1 else None,
    }
    run.update(over)
    return run


@pytest.fixture
def store(db_url: str) -> Store:
    s = Store(db_url)
    assert s.add_runs(_run(i) for i in range(60)) == 60
    return s


def test_add_runs_inserts_in_bulk_and_validates(store: Store) -> None:
    assert store.count_runs() == 60
    rec = store.get_run(60)
    assert rec.kind == "profile"
    assert rec.task == "b"
    assert len(rec.curves["step"]) == 50
    assert store.add_runs([_run(0, metrics={"loss": float("nan")})]) == 1
    assert store.get_run(61).metrics == {"loss": None}  # cleaned as every column is: non-finite is null
    with pytest.raises(ConfigError, match="kind='nope'"):
        store.add_runs([_run(0, kind="nope")])
    with pytest.raises(ValueError, match="unknown fields"):
        store.add_runs([_run(0, colour="red")])
    with pytest.raises(ValueError, match="lacks"):
        store.add_runs([{"kind": "train", "task": "t"}])
    assert store.count_runs() == 61  # a bad batch inserts nothing


def _statements(store: Store, fn: Callable[[], Any]) -> list[tuple[str, Any]]:
    """The SQL statements (with their parameters) that ``fn`` sends to the store's database."""
    seen: list[tuple[str, Any]] = []

    def listen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", listen)
    try:
        fn()
    finally:
        event.remove(store.engine, "before_cursor_execute", listen)
    return [(sql, params) for sql, params in seen if sql.lstrip().upper().startswith("SELECT")
            and "proftune_runs" in sql]


def _plans(store: Store, fn: Callable[[], Any]) -> Iterator[tuple[str, list[str]]]:
    with store.engine.connect() as conn:
        for sql, params in _statements(store, fn):
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params).all()
            yield sql, [str(r[-1]) for r in rows]


LISTINGS: list[dict[str, Any]] = [
    {"task": "a"}, {"kind": "train"}, {"status": "failed"}, {"study": "s1"}, {"parent_id": 3},
    {"task": "a", "kind": "train"}, {"kind": "trial", "study": "s1", "status": "running"},
    {"task": "b", "kind": "profile", "status": "finished"},
]


@pytest.mark.parametrize("filters", LISTINGS, ids=lambda f: "+".join(f))
def test_filtered_listings_read_an_index_in_id_order(store: Store, filters: dict[str, Any]) -> None:
    plans = list(_plans(store, lambda: store.list_runs(limit=50, summary=True, **filters)))
    assert len(plans) == 1
    sql, plan = plans[0]
    text = " ".join(plan)
    assert "USING INDEX" in text, (sql, plan)  # no full-table read
    assert "TEMP B-TREE" not in text, (sql, plan)  # no sort of the matching rows: read newest first
    if {"task", "kind"} <= set(filters):  # the pair's own index, not one of kind alone
        assert "ix_proftune_runs_task_kind" in text, plan


def test_unfiltered_listing_reads_only_the_newest_rows(store: Store) -> None:
    (sql, plan), = _plans(store, lambda: store.list_runs(limit=50, summary=True))
    assert "TEMP B-TREE" not in " ".join(plan)
    assert "LIMIT" in sql.upper()
    runs = store.list_runs(limit=5, summary=True)
    assert [r.id for r in runs] == [60, 59, 58, 57, 56]


def test_listing_leaves_out_the_big_columns(store: Store) -> None:
    (sql, _), = _statements(store, lambda: store.list_runs(limit=50, summary=True))
    for big in ("curves", "config", "env", "result", "anomalies", "error"):
        assert f"proftune_runs.{big}" not in sql, sql
    rec = store.list_runs(limit=1, summary=True)[0]
    assert rec.metrics == {"accuracy": 0.59}
    assert rec.curves == {}
    assert rec.summary()["run_id"] == 60
    assert store.list_runs(limit=1)[0].curves  # the full listing still has everything


def test_reaping_reads_the_running_runs_of_this_host_only(store: Store) -> None:
    plans = list(_plans(store, store.reap_stale))
    assert plans
    assert all("USING INDEX" in " ".join(p) for _, p in plans)
    assert all("curves" not in sql for sql, _ in plans)


def test_an_older_store_gains_the_new_index(db_url: str) -> None:
    Store(db_url)
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP INDEX ix_proftune_runs_task_kind_status")
    Store(db_url)
    names = {ix["name"] for ix in sa.inspect(engine).get_indexes("proftune_runs")}
    assert "ix_proftune_runs_task_kind_status" in names
