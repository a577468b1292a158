"""Locks: a held output folder or study refuses a second owner, naming it; a killed holder's
lock passes to the next one; tune holders share a study, an optimize holder owns it alone."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from proftune.exceptions import ConfigError
from proftune.track import LOCK_FILE, FolderLock, Store, StudyLock
from proftune.track._lock import STALE_S, locks_table

SRC = Path(__file__).resolve().parents[2] / "src"

_HOLDER = textwrap.dedent("""
    import sys
    from proftune.track import FolderLock, Store, StudyLock
    kind, where, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    if kind == "folder":
        lock = FolderLock(where, command="optimize")
    else:
        lock = StudyLock(Store(where), extra[0], command=extra[1], shared=extra[1] == "tune")
    lock.acquire()
    print("held", flush=True)
    sys.stdin.readline()   # hold until the test says so (or kills this process)
""")


@contextmanager
def _holder(*args: str) -> Iterator[subprocess.Popen[str]]:
    """Another process holding a lock until it is killed; yields once it holds it."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "held", proc.stderr.read() if proc.stderr else line
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def test_a_held_folder_is_refused_naming_the_holder_and_freed_when_it_is_killed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with _holder("folder", str(out)) as proc:
        with pytest.raises(ConfigError) as err:
            FolderLock(out, command="optimize").acquire()
        text = str(err.value)
        assert text.startswith(f"out={str(out)!r} is in use by optimize (pid {proc.pid}")  # the argument
        assert text.endswith("choose another out=.")
        assert socket.gethostname() in text
        assert "since" in text
        assert FolderLock(out, command="optimize").holder() is not None
        _kill(proc)
        assert (out / LOCK_FILE).exists()  # the killed holder's file is left behind ...
        assert FolderLock(out, command="optimize").holder() is None  # ... but holds nothing
        with FolderLock(out, command="optimize") as lock:
            holder = lock.holder()
            assert holder is not None
            assert holder.pid == os.getpid()
        assert not (out / LOCK_FILE).exists()  # released: removed


def test_an_optimize_study_excludes_everyone_until_its_process_dies(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    store = Store(db)
    with _holder("study", db, "cnn", "optimize") as proc:
        for command, shared in (("optimize", False), ("tune", True)):
            with pytest.raises(ConfigError) as err:
                StudyLock(store, "cnn", command=command, shared=shared).acquire()
            assert f"optimize (pid {proc.pid} on {socket.gethostname()}" in str(err.value)
            assert str(err.value).endswith("give another study=.")  # the argument; the CLI reads --study
        with StudyLock(store, "other", command="optimize"):  # another study is free
            pass
        _kill(proc)
        with StudyLock(store, "cnn", command="optimize") as lock:  # the dead holder's row is taken over
            assert lock.holders() == []
    with Store(db).engine.connect() as conn:
        assert conn.execute(locks_table.select()).all() == []  # released: no row left


def test_tune_runs_share_a_study_and_an_optimize_is_refused_while_they_run(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    store = Store(db)
    with _holder("study", db, "shared", "tune") as proc:
        with StudyLock(store, "shared", command="tune", shared=True) as lock:
            assert [h.pid for h, shared in lock.holders()] == [proc.pid]
        with pytest.raises(ConfigError, match=f"tune \\(pid {proc.pid}"):
            StudyLock(store, "shared", command="optimize").acquire()


def test_a_holder_on_another_host_counts_until_its_heartbeat_is_stale(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    StudyLock(store, "s", command="optimize")  # creates the table

    def remote(age_s: float) -> None:
        with store.engine.begin() as conn:
            conn.execute(locks_table.delete())
            conn.execute(locks_table.insert().values(
                resource="study:s", holder="elsewhere:7:1.0", shared=False, command="optimize", host="elsewhere",
                pid=7, started=1.0, since="2024-01-01T00:00:00+00:00", heartbeat=time.time() - age_s))

    remote(1.0)
    with pytest.raises(ConfigError, match="pid 7 on elsewhere"):
        StudyLock(store, "s", command="optimize").acquire()
    remote(2 * STALE_S)
    with StudyLock(store, "s", command="optimize") as lock:
        assert lock.holders() == []


def test_a_reused_pid_is_no_holder(tmp_path: Path) -> None:
    """A row whose pid now belongs to another process (another start time) is stale."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    StudyLock(store, "s", command="optimize")
    live = os.getppid()  # a live process that never took the lock
    with store.engine.begin() as conn:
        conn.execute(locks_table.insert().values(
            resource="study:s", holder=f"{socket.gethostname()}:{live}:1.0", shared=False, command="optimize",
            host=socket.gethostname(), pid=live, started=1.0, since="2024-01-01T00:00:00+00:00",
            heartbeat=time.time()))
    if not Path(f"/proc/{live}/stat").exists():
        pytest.skip("no process start times on this system")
    with StudyLock(store, "s", command="optimize") as lock:
        assert lock.holders() == []


def test_locks_are_reentrant_in_one_process(tmp_path: Path) -> None:
    """optimize holds its study exclusively and its own search calls take it again (shared)."""
    store = Store(f"sqlite:///{tmp_path / 's.db'}")
    with StudyLock(store, "s", command="optimize"), StudyLock(store, "s", command="tune", shared=True), \
            FolderLock(tmp_path / "o", command="optimize"), FolderLock(tmp_path / "o", command="optimize"):
        assert (tmp_path / "o" / LOCK_FILE).exists()
    assert not (tmp_path / "o" / LOCK_FILE).exists()
