"""A run ended by SIGTERM is handled like Ctrl-C: recorded ``interrupted``, temp folders gone."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _running_run(db: Path, proc: subprocess.Popen[str], limit_s: float = 90.0) -> None:
    """Return once the subprocess has a ``running`` run in ``db`` (bounded)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        if db.exists():
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                rows = con.execute("SELECT status FROM proftune_runs").fetchall()
            except sqlite3.OperationalError:
                rows = []
            finally:
                con.close()
            if ("running",) in rows:
                return
        time.sleep(0.2)
    raise AssertionError("no running run appeared")


def test_sigterm_to_train_records_the_run_interrupted(tmp_path: Path) -> None:
    db, tmp = tmp_path / "p.db", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "proftune.cli", "train", "digits-mlp", "--epochs", "100000",
                             "--db", f"sqlite:///{db}"], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _running_run(db, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert "Traceback" not in err
    con = sqlite3.connect(db)
    try:
        assert con.execute("SELECT status FROM proftune_runs").fetchall() == [("interrupted",)]
    finally:
        con.close()
    assert list(tmp.glob("proftune-*")) == []
    listed = subprocess.run([sys.executable, "-m", "proftune.cli", "runs", "list", "--status", "interrupted",
                             "--db", f"sqlite:///{db}", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert '"interrupted"' in listed.stdout


@pytest.mark.slow  # ~20-30 s: compress trains its baseline before the temp folder exists
def test_sigterm_to_compress_removes_its_temp_folder(tmp_path: Path) -> None:
    db, tmp = tmp_path / "c.db", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "proftune.cli", "compress", "digits-mlp", "--prune", "unstructured",
                             "--db", f"sqlite:///{db}"], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        end = time.monotonic() + 90
        while not list(tmp.glob("proftune-compress-*")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, "compress made no temp folder"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert list(tmp.glob("proftune-compress-*")) == []
    con = sqlite3.connect(db)
    try:
        assert ("interrupted",) in con.execute("SELECT status FROM proftune_runs").fetchall()
    finally:
        con.close()
