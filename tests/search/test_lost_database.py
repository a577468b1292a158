"""A study survives its database going away between a trial's end and its record (issue 62): the
error names the database and what was lost; the trial whose metrics were written but whose end
never reached the study is not counted complete, nor handed to the importance analysis, and the
next run of the study fails it, runs its configuration again and continues."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
from optuna.storages._cached_storage import _CachedStorage
from optuna.trial import TrialState

import proftune
from proftune.exceptions import RunFailedError
from proftune.track import Store

SPACE = {"params": {"x": {"type": "float", "low": -1.0, "high": 1.0}}}


def _fn(p: dict[str, Any]) -> dict[str, float]:
    return {"loss": (p["x"] - 0.2) ** 2}


@pytest.mark.filterwarnings("ignore::proftune._deprecated.ExperimentalWarning")
def test_a_lost_tell_is_named_and_the_next_run_continues_the_study(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    kw: dict[str, Any] = {"objectives": ["loss:min"], "db": url, "study": "s", "sampler": "random",
                          "reevaluate": 0.0}
    real = _CachedStorage.set_trial_state_values
    told = []

    def gone(self: Any, trial_id: int, state: TrialState, values: Any = None) -> bool:
        if state == TrialState.COMPLETE:
            told.append(trial_id)
            if len(told) == 2:  # the second trial's end: the server is gone
                raise sa.exc.OperationalError("UPDATE trials SET state=?", {},
                                              Exception("server closed the connection unexpectedly"))
        return real(self, trial_id, state, values)

    monkeypatch.setattr(_CachedStorage, "set_trial_state_values", gone)
    with pytest.raises(RunFailedError) as err:
        proftune.search(_fn, SPACE, trials=4, **kw)
    message = str(err.value)
    assert str(tmp_path / "p.db") in message
    assert "server closed the connection unexpectedly" in message
    assert "Lost: trial 1 ended" in message
    monkeypatch.undo()

    store = Store(url)
    lost = next(r for r in store.list_runs(kind="trial") if r.config.get("trial") == 1)
    assert lost.status == "finished"  # its metrics were written: proftune's record of it holds
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    store.update_run(lost.id, pid=proc.pid)  # the process that ran it is gone

    result = proftune.search(_fn, SPACE, trials=4, **kw)  # before: "values should be set for a complete trial"
    by_number = {t.number: t for t in result.trials}
    assert by_number[1].state == "failed"
    assert "never reached the study's database" in (by_number[1].reason or "")
    assert result.counts()["complete"] == 4
    assert "error" not in result.importance.get("loss", {}).get("ped_anova", {})
    study = optuna.load_study(study_name="s", storage=url)
    assert study.trials[1].state == TrialState.FAIL
    assert any(t.system_attrs.get("failed_trial") == 1 for t in study.trials)  # its configuration retried


def test_the_lost_database_is_named_with_its_password_hidden() -> None:
    from proftune.search import Objective, Space
    from proftune.search._settings import SearchSettings
    from proftune.search._study import _lost_message

    settings = SearchSettings(task="wine-mlp", space=Space.from_dict(SPACE), objectives=[Objective("loss", "minimize")],
                              constraints=[], trials=4, study="s", db="postgresql+psycopg2://me:s3cret@db.lan/runs")
    err = sa.exc.OperationalError("UPDATE trials", {}, Exception("server closed the connection unexpectedly"))
    message = _lost_message(settings, (7, 42), err)
    assert "s3cret" not in message
    assert "postgresql+psycopg2://me:***@db.lan/runs" in message
    assert "trial 7 ended" in message
    assert "trial run 42" in message
