"""The experiment log: every run proftune makes, in one SQL database (SQLite by default).

SQLite runs in WAL mode with a busy timeout and retries, so several processes can write at
once without losing a run; a run that crashes is marked failed, never left half-written.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import socket
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from .._jsonsafe import json_safe
from ..exceptions import ConfigError, StoreError
from ._database import (
    check_sqlite_file,
    foreign_tables,
    installed_driver,
    is_retryable,
    no_space_error,
    path_as_url,
    read_only_error,
    redact_url,
    refuse_foreign,
    server_no_space_error,
    sqlite_pragmas,
)
from ._outputs import held
from ._records import RUN_STATUSES, MetricDelta, RunComparison, RunRecord, diff_dicts, flatten_dict, record_from_row
from ._run_kinds import RUN_KIND_REGISTRY, RUN_KINDS, register_run_kind

__all__ = ["DEFAULT_DB", "Store", "default_db_url", "resolve_db_url"]

DEFAULT_DB = "sqlite:///proftune.db"


RUN_KIND_REGISTRY.loads_through(lambda description, name: register_run_kind(name, str(description)), named=True)

for _kind in ("train", "profile", "recommend", "tune", "trial", "compress", "diagnose", "bandit", "lr_find",
              "batch_size", "optimize", "predict"):
    register_run_kind(_kind)

T = TypeVar("T")

_metadata = sa.MetaData()
runs_table = sa.Table(
    "proftune_runs",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(32), nullable=False, index=True),
    sa.Column("task", sa.String(512), nullable=False, index=True),
    sa.Column("status", sa.String(16), nullable=False, index=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("started_at", sa.String(40), nullable=False),
    sa.Column("ended_at", sa.String(40), nullable=True),
    sa.Column("duration_s", sa.Float, nullable=True),
    sa.Column("host", sa.String(255), nullable=True),
    sa.Column("pid", sa.Integer, nullable=True),
    sa.Column("parent_id", sa.Integer, nullable=True, index=True),
    sa.Column("study", sa.String(255), nullable=True, index=True),
    sa.Column("env", sa.JSON, nullable=True),
    sa.Column("data_fingerprint", sa.String(64), nullable=True),
    sa.Column("config", sa.JSON, nullable=True),
    sa.Column("metrics", sa.JSON, nullable=True),
    sa.Column("curves", sa.JSON, nullable=True),
    sa.Column("anomalies", sa.JSON, nullable=True),
    sa.Column("artifacts", sa.JSON, nullable=True),
    sa.Column("result", sa.JSON, nullable=True),
    # `runs list --task T --kind K [--status S]`: no column alone is selective (a rare pair would read
    # every run of one kind); together they are, in id order, so a listing reads only its rows
    sa.Index("ix_proftune_runs_task_kind", "task", "kind"),
    sa.Index("ix_proftune_runs_task_kind_status", "task", "kind", "status"),
)

#: The columns a listing reads (`runs list`): never the curves, config, environment or result.
SUMMARY_COLUMNS = ("id", "kind", "task", "status", "started_at", "duration_s", "data_fingerprint",
                   "metrics", "study", "parent_id")


def default_db_url() -> str:
    """``$PROFTUNE_DB`` if set, else ``sqlite:///proftune.db`` in the working directory."""
    return os.environ.get("PROFTUNE_DB") or DEFAULT_DB


def resolve_db_url(url: str | None = None) -> str:
    """The store's URL as it is opened: the default for None, a file path as its URL, and a
    relative SQLite file made absolute now. Each connection opens the file anew, so a command
    resolves it at its start: a task that changes the working folder (as Hydra does) would
    otherwise open a second, empty store. Anything that is no URL is returned as given (the
    Store names the problem when it opens it)."""
    url = path_as_url(url or default_db_url())
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        return url
    given = parsed.database or ""
    if (parsed.get_backend_name() == "sqlite" and given and given != ":memory:"
            and not given.startswith("file:") and not os.path.isabs(given)):
        return parsed.set(database=os.path.abspath(given)).render_as_string(hide_password=False)
    return url


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def _json_column(value: Any) -> Any:
    """``value`` itself when JSON holds it as it is (checked by the C encoder: a long curve in
    milliseconds), else its cleaned copy (one NaN policy: :func:`json_safe`)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return json_safe(value)
    return value


def _redacted(exc: BaseException | None, store: Store) -> str:
    """A driver's message with the store's password taken out wherever it appears."""
    text = str(exc)
    password = sa.make_url(store.url).password
    return text.replace(str(password), "***") if password else text


class Store:
    """The run store. ``Store()`` opens ``$PROFTUNE_DB`` or ``./proftune.db``.

    Any SQLAlchemy URL works (``postgresql://...`` for many machines).
    """

    def __init__(self, url: str | None = None, *, retries: int = 40) -> None:
        self.url = resolve_db_url(url)
        #: The URL as it may be shown: its password hidden (every message and log uses it).
        self.shown_url = redact_url(self.url)
        try:
            parsed = sa.make_url(self.url)
        except sa.exc.ArgumentError:
            raise StoreError(
                f"db={self.shown_url!r} is not a database URL; give e.g. sqlite:///proftune.db "
                "or postgresql://user@host/db (or a path to a SQLite file: runs.db, runs.sqlite)."
            ) from None
        parsed = installed_driver(parsed, self.shown_url)
        if parsed != sa.make_url(self.url):
            self.url = parsed.render_as_string(hide_password=False)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        self.retries = retries
        #: The SQLite file (None: a server, or SQLite in memory).
        self.path: Path | None = None
        made: list[Path] = []
        if self.is_sqlite:
            check_sqlite_file(parsed)
            database = parsed.database
            if database and database != ":memory:" and not database.startswith("file:"):
                self.path = Path(database)
                made = [p for p in (self.path, Path(f"{database}-wal"), Path(f"{database}-shm")) if not p.exists()]
            self.engine: Engine = sa.create_engine(
                self.url, connect_args={"timeout": 60}, poolclass=sa.pool.NullPool
            )
            event.listen(self.engine, "connect", sqlite_pragmas)
        else:
            try:
                self.engine = sa.create_engine(self.url, pool_pre_ping=True)
            except Exception as exc:
                raise StoreError(f"db={self.shown_url!r} cannot be opened: {_redacted(exc, self)}") from exc
        event.listen(self.engine, "handle_error", self._full_device)
        try:
            self._retry(self._create_schema_once_created)
        except (DBAPIError, StoreError) as exc:
            if made:  # a new store that could not be made leaves nothing behind (a full disk)
                self.engine.dispose()
                for p in made:
                    with contextlib.suppress(OSError):
                        p.unlink()
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"db={self.shown_url!r} cannot be opened as a database: "
                             f"{_redacted(exc.orig, self)}") from None

    def _full_device(self, context: Any) -> None:
        """Every error of the store's database where the device holding its SQLite file is full
        (schema, a run's start or end, a lock), or where a database server's disk is full: one
        StoreError that says so, never the SQL."""
        if self.path is not None:
            error = no_space_error(self.shown_url, self.path, context.original_exception)
        elif not self.is_sqlite:
            error = server_no_space_error(self.shown_url, context.original_exception)
        else:
            return
        if error is not None:
            raise error

    def _create_schema_once_created(self) -> None:
        """The schema, where another process creating it at the same moment (PostgreSQL's
        ``CREATE TABLE`` is not safe beside another: a unique violation in ``pg_type``) made it first."""
        for attempt in range(5):
            try:
                self._create_schema()
                return
            except IntegrityError:
                if self.is_sqlite or attempt == 4:
                    raise
                time.sleep(0.05 * (1 + random.random()))

    def _create_schema(self) -> None:
        """The tables, and the indexes a store made by an older version lacks (create_all adds
        indexes only with a new table). A database of another application is refused as it is."""
        if not self.is_sqlite:  # SQLite files were read before any connection (no WAL switch)
            foreign = foreign_tables(sa.inspect(self.engine).get_table_names())
            if foreign is not None:
                raise refuse_foreign(self.shown_url, foreign)
        if self.is_sqlite and self._schema_present():
            return  # every table and index there: one read, not create_all's checks (30 ms a Store)
        _metadata.create_all(self.engine)
        for index in runs_table.indexes:
            index.create(self.engine, checkfirst=True)

    def _schema_present(self) -> bool:
        """Whether the SQLite database holds every table and index of the schema already (a search
        opens a Store per chunk and per worker; issue 60)."""
        wanted = {t.name for t in _metadata.tables.values()} | {
            str(i.name) for t in _metadata.tables.values() for i in t.indexes}
        with self.engine.connect() as conn:
            names = {r[0] for r in conn.exec_driver_sql(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}
        return wanted <= names

    # -- plumbing ---------------------------------------------------------------------------
    def _retry(self, fn: Callable[[], T]) -> T:
        delay = 0.02
        for attempt in range(self.retries):
            try:
                return fn()
            except OperationalError as exc:
                if self.is_sqlite and "readonly database" in str(exc.orig):  # made read-only since it was opened
                    raise read_only_error(self.shown_url, "the database became read-only") from None
                if attempt == self.retries - 1 or not is_retryable(exc):
                    raise
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    def _write(self, stmt: Any) -> Any:
        def go() -> Any:
            with self.engine.begin() as conn:
                return conn.execute(stmt)

        return self._retry(go)

    # -- runs -------------------------------------------------------------------------------
    def start_run(
        self,
        kind: str,
        task: str,
        *,
        config: Mapping[str, object] | None = None,
        env: Mapping[str, object] | None = None,
        data_fingerprint: str | None = None,
        parent_id: int | None = None,
        study: str | None = None,
    ) -> int:
        """Insert a run in state ``running`` and return its id."""
        if kind not in RUN_KINDS:
            raise ConfigError(f"run kind={kind!r} is unknown; valid: {', '.join(RUN_KINDS)}.")
        stmt = runs_table.insert().values(
            kind=kind, task=task, status="running", started_at=_now(), host=socket.gethostname(),
            pid=os.getpid(), parent_id=parent_id, study=study, env=json_safe(env or {}),
            data_fingerprint=data_fingerprint, config=json_safe(config or {}),
            metrics={}, curves={}, anomalies=[], artifacts={}, result={},
        )
        result = self._write(stmt)
        return int(result.inserted_primary_key[0])

    def update_run(self, run_id: int, **fields: Any) -> None:
        """Set some columns of a run (JSON-safe copies of the values)."""
        allowed = {c.name for c in runs_table.columns} - {"id"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"unknown run fields {sorted(unknown)}; valid: {sorted(allowed)}.")
        values = {k: json_safe(v) for k, v in fields.items()}
        self._write(runs_table.update().where(runs_table.c.id == run_id).values(**values))

    def finish_run(
        self,
        run_id: int,
        *,
        status: str = "finished",
        error: str | None = None,
        **fields: Any,
    ) -> None:
        """Mark a run finished (or failed, with its error) and store its results (``ended_at``
        among them: the time its work ended, where that was before now)."""
        if status not in RUN_STATUSES:
            raise ValueError(f"status={status!r} is unknown; valid: {', '.join(RUN_STATUSES)}.")
        # the two columns it needs, not the whole record with its JSON parsed (done once a search trial)
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(runs_table.c.started_at, runs_table.c.parent_id)
                               .where(runs_table.c.id == int(run_id))).first()
        if row is None:
            raise ConfigError(f"run {run_id} does not exist in {self.shown_url}.")
        started_at, parent_id = row
        runs = held()
        if runs is not None and status == "finished" and parent_id is None:
            # a command's Run waits for the command's outputs (track._outputs.held_until_written),
            # running: this process is finishing it, whatever a sweep of stale runs took it for
            fields.pop("ended_at", None)
            self.update_run(run_id, status="running", ended_at=None, error=error, **fields)
            if not runs.holds(self.url, run_id):
                runs.runs.append((self, run_id))
            runs.ended[(self.url, run_id)] = _now()  # the work's end, which the outputs then show
            return
        ended = fields.pop("ended_at", None) or _now()
        started = dt.datetime.fromisoformat(started_at)
        duration = (dt.datetime.fromisoformat(ended) - started).total_seconds()
        self.update_run(run_id, status=status, error=error, ended_at=ended, duration_s=duration, **fields)

    @contextlib.contextmanager
    def track(self, kind: str, task: str, **start: Any) -> Iterator[RunHandle]:
        """A run that is marked failed (with the error) if the block raises, interrupted on Ctrl-C or
        SIGTERM (a KeyboardInterrupt), finished otherwise."""
        run_id = self.start_run(kind, task, **start)
        handle = RunHandle(self, run_id)
        try:
            yield handle
        except BaseException as exc:
            message = f"{type(exc).__name__}: {exc}"
            detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]
            status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            with contextlib.suppress(Exception):
                self.finish_run(run_id, status=status, error=message + "\n" + detail, **handle.pending)
            raise
        else:
            self.finish_run(run_id, status="finished", **handle.pending)

    def get_run(self, run_id: int) -> RunRecord:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(runs_table).where(runs_table.c.id == int(run_id))).mappings().first()
        if row is None:
            raise ConfigError(f"run {run_id} does not exist in {self.shown_url}.")
        return self._as_recorded(record_from_row(row))

    def _as_recorded(self, record: RunRecord) -> RunRecord:
        """A run held until its command's outputs are written reads, inside that command, as it
        will be recorded then (``finished``): the report and the exporters written meanwhile show it so."""
        runs = held()
        if runs is not None and record.status == "running" and runs.holds(self.url, record.id):
            ended = runs.ended.get((self.url, record.id))
            if ended is None:
                return replace(record, status="finished")
            duration = (dt.datetime.fromisoformat(ended) - dt.datetime.fromisoformat(record.started_at)).total_seconds()
            return replace(record, status="finished", ended_at=ended, duration_s=duration)
        return record

    def get_runs(self, run_ids: Iterable[int]) -> list[RunRecord]:
        """The runs ``run_ids`` in that order; a ConfigError names every one that does not exist."""
        ids = [int(i) for i in run_ids]
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(runs_table).where(runs_table.c.id.in_(ids))).mappings().all()
        found = {int(r["id"]): self._as_recorded(record_from_row(r)) for r in rows}
        missing = [i for i in dict.fromkeys(ids) if i not in found]
        if missing:
            names = ", ".join(str(i) for i in missing)
            raise ConfigError(f"run{'s' if len(missing) > 1 else ''} {names} "
                              f"{'do' if len(missing) > 1 else 'does'} not exist in {self.shown_url}.")
        return [found[i] for i in ids]

    def list_runs(
        self,
        *,
        task: str | None = None,
        kind: str | None = None,
        status: str | None = None,
        study: str | None = None,
        parent_id: int | None = None,
        limit: int | None = None,
        summary: bool = False,
    ) -> list[RunRecord]:
        """Runs, newest first, filtered by any of the given fields (each an indexed column).

        ``summary=True`` reads only :data:`SUMMARY_COLUMNS` (what a listing shows); the other
        fields of the records are left empty.
        """
        columns = [runs_table.c[c] for c in SUMMARY_COLUMNS] if summary else list(runs_table.columns)
        stmt = sa.select(*columns).order_by(runs_table.c.id.desc())
        for col, value in (("task", task), ("kind", kind), ("status", status), ("study", study),
                           ("parent_id", parent_id)):
            if value is not None:
                stmt = stmt.where(runs_table.c[col] == value)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).mappings().all()
        return [record_from_row(r) for r in rows]

    def add_runs(self, runs: Iterable[Mapping[str, Any]]) -> int:
        """Insert finished (or failed, or running) runs in one transaction; return how many.

        Each mapping holds :class:`RunRecord` fields except ``id`` (``kind``, ``task``,
        ``status`` and ``started_at`` are required). For importing a log or building a large
        store quickly; a run being made uses :meth:`track`.
        """
        allowed = {c.name for c in runs_table.columns} - {"id"}
        rows: list[dict[str, object]] = []
        for i, run in enumerate(runs):
            unknown = set(run) - allowed
            if unknown:
                raise ValueError(f"runs[{i}] has unknown fields {sorted(unknown)}; valid: {sorted(allowed)}.")
            missing = [k for k in ("kind", "task", "status", "started_at") if run.get(k) is None]
            if missing:
                raise ValueError(f"runs[{i}] lacks {missing}.")
            if run["kind"] not in RUN_KINDS:
                raise ConfigError(f"runs[{i}] kind={run['kind']!r} is unknown; valid: {', '.join(RUN_KINDS)}.")
            if run["status"] not in RUN_STATUSES:
                raise ValueError(f"runs[{i}] status={run['status']!r} is unknown; valid: {', '.join(RUN_STATUSES)}.")
            row = dict.fromkeys(allowed)
            row.update({"env": {}, "config": {}, "metrics": {}, "curves": {}, "anomalies": [],
                        "artifacts": {}, "result": {}})
            row.update({k: _json_column(v) for k, v in run.items()})
            rows.append(row)
        if rows:
            def go() -> None:
                with self.engine.begin() as conn:
                    conn.execute(runs_table.insert(), rows)

            self._retry(go)
        return len(rows)

    def count_runs(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(runs_table)).scalar_one())

    def reap_stale(self) -> int:
        """Mark failed the runs of this host left ``running`` by a process that no longer exists."""
        host = socket.gethostname()
        c = runs_table.c
        stmt = sa.select(c.id, c.pid).where(c.status == "running", c.host == host)
        with self.engine.connect() as conn:
            running = conn.execute(stmt).all()
        stale = [int(run_id) for run_id, pid in running if pid is not None and not pid_alive(int(pid))]
        for run_id in stale:
            self.finish_run(run_id, status="failed",
                            error="the process ended without finishing the run (killed or crashed)")
        return len(stale)

    def compare(self, a: int, b: int) -> RunComparison:
        """Config diff, environment diff, data fingerprint match and metric deltas of two runs."""
        ra, rb = self.get_runs([a, b])
        metric_delta: dict[str, MetricDelta] = {}
        for key in sorted(set(ra.metrics) | set(rb.metrics)):
            va, vb = ra.metrics.get(key), rb.metrics.get(key)
            delta = vb - va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) else None
            metric_delta[key] = {"a": va, "b": vb, "delta": delta}
        return {
            "a": ra.id, "b": rb.id,
            "task": {"a": ra.task, "b": rb.task, "same": ra.task == rb.task},
            "config": diff_dicts(ra.config, rb.config),
            "env": diff_dicts(flatten_dict(ra.env), flatten_dict(rb.env)),
            "data_fingerprint": {
                "a": ra.data_fingerprint[:8] if ra.data_fingerprint else None,
                "b": rb.data_fingerprint[:8] if rb.data_fingerprint else None,
                "match": ra.data_fingerprint is not None and ra.data_fingerprint == rb.data_fingerprint,
            },
            "metrics": metric_delta,
        }


class RunHandle:
    """The run a :meth:`Store.track` block writes; ``set(...)`` stages what finish stores."""

    def __init__(self, store: Store, run_id: int) -> None:
        self.store, self.id = store, run_id
        self.pending: dict[str, Any] = {}

    def set(self, **fields: Any) -> None:
        """Stage columns (metrics, curves, anomalies, artifacts, result, ...) for the finish."""
        self.pending.update(fields)

    def update(self, **fields: Any) -> None:
        """Write columns now (progress that should survive a crash)."""
        self.store.update_run(self.id, **fields)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


