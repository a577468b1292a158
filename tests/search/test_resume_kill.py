"""SIGKILL mid-trial, then the same command again: the study completes and loses no finished trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import optuna
from optuna.trial import TrialState

HERE = Path(__file__).parent


def test_sigkill_mid_study_then_rerun_completes(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: int, low: 4, high: 32}\n"
                     "  lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n")
    db = f"sqlite:///{tmp_path / 'p.db'}"
    cmd = [sys.executable, "-m", "proftune.cli", "tune", f"{HERE / '_tasks.py'}:BlockingWine",
           "--space", str(space), "--trials", "4", "--epochs", "1", "--sampler", "random",
           "--study", "killed", "--db", db, "--json"]
    env = {**os.environ, "PROFTUNE_TEST_BLOCK": "1", "PROFTUNE_DB": db}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(300, proc.kill)  # never hang the suite
    watchdog.start()
    seen = []
    assert proc.stderr is not None
    for line in proc.stderr:  # blocks until the child reports it is inside its third trial
        seen.append(line)
        if "BLOCKING-IN-TRIAL" in line:
            break
    watchdog.cancel()
    assert any("BLOCKING-IN-TRIAL" in s for s in seen), "".join(seen)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL

    study = optuna.load_study(study_name="killed", storage=db)
    before = {t.number: (t.params, t.values) for t in study.trials if t.state == TrialState.COMPLETE}
    running = [t for t in study.trials if t.state == TrialState.RUNNING]
    assert len(before) == 2
    assert len(running) == 1
    killed = running[0]

    env.pop("PROFTUNE_TEST_BLOCK")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    study = optuna.load_study(study_name="killed", storage=db)
    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(complete) == 4  # the study completed its trial count
    for number, (params, values) in before.items():  # no finished trial lost or changed
        assert (study.trials[number].params, study.trials[number].values) == (params, values)
    assert study.trials[killed.number].state == TrialState.FAIL  # marked failed...
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1
    assert retries[0].params == killed.params
    assert retries[0].state == TrialState.COMPLETE
    states = [t["state"] for t in out["trials"]]
    assert states.count("complete") == 4
    assert states.count("failed") == 1
