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


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    given = os.environ.get("PROFTUNE_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) are absent: apt-get install postgresql, "
                    "or set PROFTUNE_TEST_POSTGRES_URL")
    pytest.importorskip("psycopg2", reason="psycopg2-binary is in the dev extra: pip install -e '.[dev]'")
    root = tempfile.mkdtemp(prefix="proftune-pg-")
    data = os.path.join(root, "data")
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root: run the server as the postgres user
        os.chmod(root, 0o777)
        as_user = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    run = lambda *args: subprocess.run([*as_user, *args], check=True, capture_output=True, text=True)  # noqa: E731
    run(os.path.join(bindir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
    run(os.path.join(bindir, "pg_ctl"), "-D", data, "-w", "-l", os.path.join(root, "log"), "-o",
        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, os.path.join(bindir, "pg_ctl"), "-D", data, "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
