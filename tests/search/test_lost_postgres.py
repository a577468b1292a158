"""PostgreSQL stopped in the middle of a study (issue 62, item 2), on a real server: ``tune`` exits 1
naming the database (its password hidden) and what was lost; once the server is back, the same
command continues the study and completes it. Skipped, saying why, where no server can start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from typer.testing import CliRunner

from proftune.cli import app

#: Trial 1 (the second call) stops the server once its result is in hand, before it is recorded.
OBJECTIVE = '''
import json
import os
import subprocess

CALLS = []


def loss(params):
    CALLS.append(1)
    if len(CALLS) == 2 and os.environ.get("STOP_SERVER"):
        subprocess.run(json.loads(os.environ["STOP_SERVER"]), check=True, capture_output=True)
    return {"loss": (params["x"] - 0.2) ** 2}
'''


def test_a_study_survives_its_postgresql_server_stopping(tmp_path: Path, postgres_server: Any) -> None:
    (tmp_path / "obj.py").write_text(OBJECTIVE)
    (tmp_path / "space.yaml").write_text("params:\n  x: {type: float, low: -1.0, high: 1.0}\n")
    url = postgres_server.url(password="s3cret")
    args = ["tune", f"{tmp_path / 'obj.py'}:loss", "--space", str(tmp_path / "space.yaml"), "--trials", "4",
            "--objective", "loss:min", "--sampler", "random", "--study", "pg-lost", "--db", url]
    # its own process: the next run finds the trial's process gone at once (no heartbeat to wait out)
    lost = subprocess.run([sys.executable, "-m", "proftune.cli", *args],
                          env={**os.environ, "STOP_SERVER": json.dumps(postgres_server.stop_command())},
                          capture_output=True, text=True, timeout=300)
    assert lost.returncode == 1, lost.stderr
    assert "lost its database postgresql+psycopg2://postgres:***@127.0.0.1" in lost.stderr
    assert "s3cret" not in lost.stderr + lost.stdout
    assert "Lost: trial 1 ended" in lost.stderr
    assert "UnboundLocalError" not in lost.stderr
    assert "Traceback" not in lost.stderr

    postgres_server.start()
    again = CliRunner().invoke(app, [*args, "--json"])
    assert again.exit_code == 0, again.output
    assert "values should be set" not in again.output
    out = json.loads(again.stdout)
    assert [t["state"] for t in out["trials"]].count("complete") == 4
    assert out["trials"][1]["state"] == "failed"
    study = optuna.load_study(study_name="pg-lost", storage=url)
    assert study.trials[1].state == TrialState.FAIL
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 4
    (retry,) = [t for t in study.trials if t.system_attrs.get("failed_trial") == 1]
    assert retry.params == study.trials[1].params
