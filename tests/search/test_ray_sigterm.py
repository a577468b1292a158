"""SIGTERM to ``tune --backend ray`` (issue 47): the Ray trials are cancelled and recorded
``interrupted`` like the local workers' — ray.init's own SIGTERM handler aborted the driver (exit
-6), leaving the tune failed and its trials running in the Store and the study."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from proftune.track import Store

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                reason="ray[tune] is not installed (pip install 'proftune[ray]')")


def _running_trials(db: Path) -> int:
    if not db.exists():
        return 0
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT count(*) FROM proftune_runs WHERE kind = 'trial' AND status = 'running'")
                   .fetchone()[0])
    except sqlite3.OperationalError:  # the tables are being made
        return 0
    finally:
        con.close()


def _group(pgid: int) -> list[int]:
    psutil = pytest.importorskip("psutil")
    left = []
    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(p.pid)
    return left


def test_sigterm_to_a_ray_tune_cancels_its_trials_and_records_them_interrupted(tmp_path: Path) -> None:
    space, db = tmp_path / "s.yaml", tmp_path / "t.db"
    space.write_text("params:\n  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}\n")
    proc = subprocess.Popen([sys.executable, "-m", "proftune.cli", "tune", "digits-mlp", "--space", str(space),
                             "--trials", "300", "--epochs", "2", "--workers", "2", "--backend", "ray",
                             "--db", f"sqlite:///{db}"], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        end = time.monotonic() + 240
        while not _running_trials(db):  # Ray up and a trial inside its training, at any load
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, "no Ray trial started"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "SIGTERM received" not in err  # Ray's handler did not take the signal
        end = time.monotonic() + 30
        while _group(proc.pid) and time.monotonic() < end:  # Ray's processes end with the session
            time.sleep(0.2)
        assert _group(proc.pid) == []

        store = Store(f"sqlite:///{db}")
        tune = store.list_runs(kind="tune")
        assert [r.status for r in tune] == ["interrupted"]
        trials = store.list_runs(kind="trial")
        cut = [r for r in trials if r.status == "interrupted"]
        assert cut
        assert not [r.id for r in trials if r.status == "running"]
        assert all("Ray trial was cancelled" in (r.error or "") for r in cut)
        study = optuna.load_study(study_name=tune[0].study, storage=f"sqlite:///{db}")
        states = optuna.trial.TrialState
        assert not [t.number for t in study.trials if t.state == states.RUNNING]
        by_number = {t.number: t for t in study.trials}
        assert all(by_number[int(r.config["trial"])].user_attrs.get("interrupted") is True for r in cut)
        assert len([t for t in study.trials if t.state == states.WAITING]) == len(cut)  # queued again
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its group only: Ray's processes of this test
