"""A real PostgreSQL server for the search tests: $PROFTUNE_TEST_POSTGRES_URL, or one started here.

The server comes from Debian's ``postgresql`` package (``.ci/run`` installs it); it runs from a
temp folder on a loopback port and is stopped after the session. The tests that need it skip,
saying why, only when the binaries are absent.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest


def _pg_bin() -> str | None:
    for name in ("initdb", "pg_ctl"):
        if shutil.which(name) is None:
            break
    else:
        return os.path.dirname(os.path.realpath(shutil.which("initdb") or ""))
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """A PostgreSQL server in a temp folder on a loopback port, which a test may stop and start."""

    def __init__(self, bindir: str) -> None:
        self.bindir = bindir
        self.root = tempfile.mkdtemp(prefix="proftune-pg-")
        self.data = os.path.join(self.root, "data")
        #: initdb refuses to run as root: the server then runs as the postgres user
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            os.chmod(self.root, 0o777)
        self.port = _free_port()
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync")

    def _run(self, tool: str, *args: str, check: bool = True) -> None:
        subprocess.run([*self.as_user, os.path.join(self.bindir, tool), *args], check=check, capture_output=True,
                       text=True)

    def url(self, password: str | None = None) -> str:
        auth = f"postgres:{password}" if password else "postgres"  # trust: any password is accepted
        return f"postgresql+psycopg2://{auth}@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-w", "-l", os.path.join(self.root, "log"), "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop_command(self) -> list[str]:
        """The command that stops the server at once (``immediate``: no client is waited for)."""
        return [*self.as_user, os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "immediate", "-w",
                "stop"]

    def stop(self) -> None:
        subprocess.run(self.stop_command(), capture_output=True)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _pg_server() -> PgServer:
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) are absent: apt-get install postgresql, "
                    "or set PROFTUNE_TEST_POSTGRES_URL")
    pytest.importorskip("psycopg2", reason="psycopg2-binary is in the dev extra: pip install -e '.[dev]'")
    try:
        server = PgServer(bindir)
        server.start()
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"PostgreSQL could not start here: {exc}")
    return server


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    given = os.environ.get("PROFTUNE_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    server = _pg_server()
    try:
        yield server.url()
    finally:
        server.remove()


@pytest.fixture
def postgres_server() -> Iterator[PgServer]:
    """A server of this test's own, which it may stop and start again (the session's is shared)."""
    server = _pg_server()
    try:
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """One local Ray instance per test module, started as ``proftune tune --backend ray`` starts it
    (two CPUs). The module's searches join it (Ray starts once for all of them); it stops after the
    module. Each module has its own, so that ``--dist loadgroup`` can put two modules on two workers."""
    from proftune.search import RayOptions
    from proftune.search._ray import ray_session

    with ray_session(RayOptions(workers=2)) as ray:
        yield ray
