"""What the Store checks of its database before and while it uses it: a database that is neither
proftune's nor Optuna's is refused untouched, a read-only file or a full disk is said as such, the
driver of the URL is installed, a locked SQLite database is retried; and the URL is redacted
wherever it is shown."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ..exceptions import DependencyError, StoreError

__all__ = ["redact_url"]


def redact_url(url: str | sa.URL) -> str:
    """``url`` as it may be printed or logged: its password replaced by ``***``
    (``postgresql://u:***@host/db``). In a string that is no URL, whatever lies between a colon
    and an ``@`` is hidden."""
    if isinstance(url, sa.URL):
        return url.render_as_string(hide_password=True)
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except (sa.exc.ArgumentError, ValueError, TypeError):
        import re

        return re.sub(r"(?<=:)[^:@/\s]+(?=@)", "***", str(url))


#: Tables that make a database proftune's or Optuna's (Optuna's RDB storage).
_OPTUNA_TABLES = frozenset({"studies", "version_info"})


def foreign_tables(tables: Iterable[str]) -> list[str] | None:
    """The tables of a database that belongs to another application (None: it is proftune's or
    Optuna's, or empty)."""
    names = sorted(tables)
    if not names or any(t.startswith("proftune_") for t in names) or _OPTUNA_TABLES <= set(names):
        return None
    return names


def _sqlite_tables(path: Path) -> list[str]:
    """The table names of an existing SQLite file, read by SQLite itself and without changing it
    (``mode=ro``: no journal-mode switch, no write; its WAL is read, so a database that another
    process writes now reads as it is).

    The file is never opened by other means: closing any descriptor of a file drops every POSIX
    lock this process holds on it, SQLite's own included, after which another process may reset
    the WAL under a live writer ("How To Corrupt An SQLite Database File", section 2.2). SQLite's
    own descriptors are shared per file within the process and kept while a lock lives.
    """
    from urllib.parse import quote

    conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=60)
    try:
        conn.execute("PRAGMA busy_timeout=60000")
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    finally:
        conn.close()


def refuse_foreign(shown: str, tables: list[str]) -> StoreError:
    listed = ", ".join(tables[:8]) + (f" and {len(tables) - 8} more" if len(tables) > 8 else "")
    return StoreError(
        f"db={shown!r} holds another application's tables ({listed}), neither proftune's nor "
        "Optuna's; it was left untouched. Give a new file name or an existing proftune database.")


def _read_only(path: Path) -> str | None:
    """What of a SQLite database at ``path`` cannot be written (None: all of it can): the file, or
    its folder, where SQLite creates the file and its write-ahead log (``-wal``, ``-shm``) beside it.
    ``os.access`` asks the kernel, so an immutable file (``chattr +i``) or a read-only mount counts
    for root too, whom permission bits do not stop."""
    folder = path.parent.resolve()
    if path.exists() and not os.access(path, os.W_OK):
        return f"the database file {str(path)!r} is read-only"
    if not os.access(folder, os.W_OK | os.X_OK):
        sidecars = [Path(f"{path}-wal"), Path(f"{path}-shm")]
        if not path.exists():
            return f"folder {str(folder)!r} is read-only: the database file cannot be created there"
        if not all(s.exists() and os.access(s, os.W_OK) for s in sidecars):
            return (f"folder {str(folder)!r} is read-only: SQLite writes its log ({path.name}-wal, "
                    f"{path.name}-shm) beside the database")
    return None


def read_only_error(shown: str, what: str) -> StoreError:
    return StoreError(
        f"db={shown!r}: {what}, and proftune records every run in its store. Give db= a writable "
        "location (a new file in a folder you can write, e.g. sqlite:///proftune.db in your working "
        "folder), or make this one writable (chmod u+w on the file and its folder; chattr -i if it is "
        "immutable).")


def check_sqlite_file(url: sa.URL) -> None:
    """Refuse a SQLite URL whose file exists but is not a SQLite database (leave it untouched), or
    whose file or folder cannot be written (before any work: every command writes its run)."""
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    shown = url.render_as_string(hide_password=True)
    if path.is_dir():
        raise StoreError(f"db={shown!r} points at a directory, not a database file.")
    if not path.exists() and not path.parent.exists():
        raise StoreError(f"db={shown!r}: folder {str(path.parent)!r} does not exist.")
    what = _read_only(path)  # before SQLite reads it: that would leave its -wal and -shm beside it
    if what is not None:
        raise read_only_error(shown, what)
    if not path.exists() or path.stat().st_size == 0:
        return
    sidecars = [p for p in (Path(f"{path}-wal"), Path(f"{path}-shm")) if not p.exists()]
    try:
        tables = _sqlite_tables(path)
    except sqlite3.DatabaseError as exc:  # not a database, damaged or encrypted, or its device full
        full = no_space_error(shown, path, exc)
        if full is not None:
            for p in sidecars:  # the log files the failed read began (nothing can write there now)
                with contextlib.suppress(OSError):
                    p.unlink()
            raise full from None
        if "not a database" in str(exc):
            raise StoreError(
                f"db={url.render_as_string(hide_password=True)!r}: {str(path)!r} exists and is not a SQLite "
                "database; it was left untouched. Give a new file name or an existing proftune database."
            ) from None
        raise StoreError(f"db={url.render_as_string(hide_password=True)!r}: {str(path)!r} cannot be read "
                         f"as a SQLite database ({exc}); it was left untouched.") from exc
    foreign = foreign_tables(tables)
    if foreign is not None:
        raise refuse_foreign(shown, foreign)


#: SQLite reports a write its log could not make ("disk I/O error") where a device is full as well
#: as "database or disk is full"; with less than this free, either is read as a full device.
LOW_SPACE_BYTES = 1 << 20


def _free_bytes(path: Path) -> int | None:
    from .._paths import free_bytes

    return free_bytes(path)


def no_space_error(shown: str, path: Path, exc: BaseException) -> StoreError | None:
    """The error of a store whose device is full (None: ``exc`` is not that): what the user can
    do, without the driver's SQL."""
    text = str(getattr(exc, "orig", None) or exc).lower()
    free = _free_bytes(path)
    full = "disk is full" in text or "no space left" in text or (
        "disk i/o error" in text and free is not None and free < LOW_SPACE_BYTES)
    if not full:
        return None
    left = f"{free} bytes free" if free is not None else "its free space unknown"
    return StoreError(f"db={shown!r}: no space left on the device holding the store ({str(path)!r}, {left}); "
                      "nothing was written. Free space there, or give db= a store on another device.")


#: PostgreSQL's SQLSTATE of a full disk (``disk_full``: psycopg2's ``pgcode``, psycopg 3's ``sqlstate``).
PG_DISK_FULL = "53100"


def server_no_space_error(shown: str, exc: BaseException) -> StoreError | None:
    """The error of a database server whose disk is full (None: ``exc`` is not that), worded as
    a full SQLite file's is, without the driver's SQL."""
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)
    full = code == PG_DISK_FULL or type(orig).__name__ == "DiskFull" or "no space left on device" in str(orig).lower()
    if not full:
        return None
    host = sa.make_url(shown).host or "localhost"
    return StoreError(f"db={shown!r}: no space left on the device holding the store (the database server on "
                      f"{host}: SQLSTATE {code or PG_DISK_FULL} disk_full); nothing was written. Free space on the "
                      "server's data directory, or give db= another store.")


def installed_driver(url: sa.URL, shown: str) -> sa.URL:
    """A bare ``postgresql://`` URL (as the README writes it) on the PostgreSQL driver that is
    installed: SQLAlchemy's default (psycopg 3) or psycopg2, which ``[dev]`` installs."""
    if url.drivername != "postgresql":
        return url
    import importlib.util

    for module, driver in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return url.set(drivername=driver)
    raise DependencyError(f"db={shown!r} needs a PostgreSQL driver: pip install psycopg2-binary "
                          "(or psycopg), or name one in the URL (postgresql+psycopg2://...).")


def is_retryable(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(s in text for s in ("locked", "busy", "already exists", "deadlock", "could not serialize"))


#: A --db without a scheme whose name ends so is a SQLite file's path (``runs.db`` -> ``sqlite:///runs.db``).
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def path_as_url(url: str) -> str:
    """A path to a SQLite file (``/tmp/runs.db``, ``runs.sqlite``) as its URL; anything else as given."""
    if "://" in url or not url.lower().endswith(SQLITE_SUFFIXES):
        return url
    return f"sqlite:///{Path(url).expanduser().absolute()}"


def sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA busy_timeout=60000")
        for _ in range(50):
            try:
                cur.execute("PRAGMA journal_mode=WAL")
                break
            except Exception as exc:  # another process is switching the mode at this moment
                if "locked" not in str(exc).lower():
                    raise
                time.sleep(0.05)
        cur.execute("PRAGMA synchronous=NORMAL")
    finally:
        cur.close()
