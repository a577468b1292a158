"""Locks: one run owns an output folder, and a study, at a time.

Two ``optimize`` processes on one ``out`` folder once both "succeeded" with each other's files. Now
the second one is refused (:class:`~proftune.exceptions.ConfigError`, exit 2) with the holder's
pid, host and start time; nothing waits silently.

- :class:`FolderLock`: an ``flock`` on ``FOLDER/.proftune.lock``. The kernel releases it when
  its process dies, however it dies, so a killed run's lock is free for the next one at once
  (``resume=True``); the file only says who holds it.
- :class:`StudyLock`: a row per holder in the store's ``proftune_locks`` table, which every
  process on every machine sharing the database sees. A holder is alive while its process
  exists (same host: its pid, with its start time against pid reuse) or, on another host,
  while it refreshes its heartbeat (every :data:`HEARTBEAT_S`; silent for :data:`STALE_S`: dead).
  A dead holder's row is removed by the next contender, which then takes the lock.
  ``shared=True`` holders coexist (``tune`` processes on several machines sharing a study, as
  Optuna means studies to be shared); an exclusive holder (``optimize``) excludes every other.

Both are re-entrant within a process: ``optimize`` holds its study and its own search calls
take the same study again.
"""

from __future__ import annotations

import abc
import contextlib
import datetime as dt
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import sqlalchemy as sa

from .._jsonsafe import json_dumps
from ..exceptions import ConfigError
from ._store import Store, pid_alive

__all__ = ["HEARTBEAT_S", "LOCK_FILE", "STALE_S", "FolderLock", "Holder", "StudyLock"]

LOCK_FILE = ".proftune.lock"
#: How often a study lock's holder says it is alive, and how long a silent one on another host
#: counts as alive (seconds).
HEARTBEAT_S = 10.0
STALE_S = 120.0

_lock_metadata = sa.MetaData()
locks_table = sa.Table(
    "proftune_locks",
    _lock_metadata,
    sa.Column("resource", sa.String(512), primary_key=True),
    sa.Column("holder", sa.String(320), primary_key=True),
    sa.Column("shared", sa.Boolean, nullable=False),
    sa.Column("command", sa.String(64), nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started", sa.Float, nullable=True),
    sa.Column("since", sa.String(40), nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),
)


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: the command, its process and since when (UTC)."""

    command: str
    host: str
    pid: int
    since: str
    started: float | None = None

    def describe(self) -> str:
        return f"{self.command} (pid {self.pid} on {self.host}, since {self.since[:19].replace('T', ' ')} UTC)"

    @property
    def key(self) -> str:
        return f"{self.host}:{self.pid}:{self.started}"

    def alive(self) -> bool:
        """Whether this holder's process still runs (only answerable on its own host)."""
        if self.host != socket.gethostname():
            raise ValueError("the liveness of a process on another host is not known here")
        if not pid_alive(self.pid):
            return False
        return self.started is None or _process_start(self.pid) in (None, self.started)


def _process_start(pid: int) -> float | None:
    """The process's start time in clock ticks since boot (Linux), which tells a live holder
    from a new process that got its pid; None where the system does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return float(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _me(command: str) -> Holder:
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return Holder(command=command, host=socket.gethostname(), pid=os.getpid(), since=now,
                  started=_process_start(os.getpid()))


#: Locks this process holds: resource -> (lock, depth), for re-entry.
_held: dict[str, list[Any]] = {}
_held_guard = threading.Lock()


class _Reentrant(abc.ABC):
    """A lock taken once per process; nested acquisitions of one resource only count."""

    resource: str

    def __enter__(self) -> _Reentrant:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def acquire(self) -> None:
        with _held_guard:
            entry = _held.get(self.resource)
            if entry is not None:
                entry[1] += 1
                return
            self._take()
            _held[self.resource] = [self, 1]

    def release(self) -> None:
        with _held_guard:
            entry = _held.get(self.resource)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del _held[self.resource]
                entry[0]._drop()

    @abc.abstractmethod
    def _take(self) -> None:
        """Acquire the resource, or raise ConfigError naming its holder."""

    @abc.abstractmethod
    def _drop(self) -> None:
        """Release the resource."""


class FolderLock(_Reentrant):
    """The output folder ``folder`` belongs to this process while the lock is held.

    ``option`` is the argument that names the folder, in the refusal (``out``: ``out='x'``, which
    the CLI reads as ``--out 'x'``); the folder is created if needed.
    """

    def __init__(self, folder: str | Path, *, command: str, option: str = "out") -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.command, self.option = command, option
        self.resource = f"folder:{os.path.realpath(self.folder)}"
        self._fd: int | None = None

    def holder(self) -> Holder | None:
        """Who holds the folder now (None: nobody; the lock file of a dead process is no holder)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            if _try_flock(fd, shared=True):
                _unflock(fd)
                return None
            return _read_holder(fd)
        finally:
            os.close(fd)

    def _take(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if not _try_flock(fd, shared=False):
                holder = _read_holder(fd)
                os.close(fd)
                who = holder.describe() if holder is not None else "another process"
                raise ConfigError(
                    f"{self.option}={str(self.folder)!r} is in use by {who}: one run owns an output "
                    f"folder at a time. Wait for it to end, or choose another {self.option}=.")
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a file its last holder removed while we opened it
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json_dumps(_me(self.command).__dict__).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def _drop(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still holding it: a waiter sees a new file and retries
        os.close(self._fd)
        self._fd = None


def _try_flock(fd: int, *, shared: bool) -> bool:
    import fcntl

    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:  # ENOLCK, EOPNOTSUPP: a file system without locks
        raise ConfigError(f"the output folder cannot be locked ({exc.strerror}): its file system does not "
                          "support file locks; choose a folder on a local disk.") from exc
    return True


def _unflock(fd: int) -> None:
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_UN)


def _read_holder(fd: int) -> Holder | None:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"null")
        return Holder(**data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError):
        return None


class StudyLock(_Reentrant):
    """The study ``name`` in ``store`` belongs to this process while the lock is held (with
    ``shared=True``: to it and to other shared holders)."""

    def __init__(self, store: Store, name: str, *, command: str, shared: bool = False) -> None:
        self.store, self.name, self.command, self.shared = store, name, command, shared
        self.resource = f"study:{name}"
        self.me = _me(command)
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._engine = store.engine
        store._retry(lambda: _lock_metadata.create_all(self._engine))  # several processes may race here

    def holders(self) -> list[tuple[Holder, bool]]:
        """The live holders of the study and whether each holds it shared (dead ones removed)."""
        c = locks_table.c
        with self._engine.connect() as conn:
            rows = conn.execute(sa.select(locks_table).where(c.resource == self.resource)).mappings().all()
        live = []
        for row in rows:
            holder = Holder(command=row["command"], host=row["host"], pid=int(row["pid"]), since=row["since"],
                            started=row["started"])
            if holder.key == self.me.key:
                continue
            if self._dead(holder, float(row["heartbeat"])):
                self._write(sa.delete(locks_table).where(
                    c.resource == self.resource, c.holder == row["holder"], c.heartbeat == row["heartbeat"]))
                continue
            live.append((holder, bool(row["shared"])))
        return live

    @staticmethod
    def _dead(holder: Holder, heartbeat: float) -> bool:
        if holder.host == socket.gethostname():
            return not holder.alive()
        return time.time() - heartbeat > STALE_S

    def _write(self, stmt: Any) -> Any:
        return self.store._write(stmt)

    def _take(self) -> None:
        me = self.me
        self._write(locks_table.insert().values(
            resource=self.resource, holder=me.key, shared=self.shared, command=me.command, host=me.host,
            pid=me.pid, started=me.started, since=me.since, heartbeat=time.time()))
        # announced first, then checked: of two contenders at least one sees the other
        conflicts = [h for h, shared in self.holders() if not (shared and self.shared)]
        if conflicts:
            self._delete_mine()
            who = "; ".join(h.describe() for h in conflicts)
            raise ConfigError(
                f"study {self.name!r} is in use by {who}: tune runs may share a study, an optimize "
                "run owns its study alone. Wait for it to end, or give another study=.")
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name=f"proftune-lock-{self.name}", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        c = locks_table.c
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):  # a missed beat is retried; STALE_S allows many
                self._write(sa.update(locks_table).where(c.resource == self.resource, c.holder == self.me.key)
                            .values(heartbeat=time.time()))

    def _delete_mine(self) -> None:
        c = locks_table.c
        self._write(sa.delete(locks_table).where(c.resource == self.resource, c.holder == self.me.key))

    def _drop(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
            self._beat = None
        with contextlib.suppress(Exception):
            self._delete_mine()
