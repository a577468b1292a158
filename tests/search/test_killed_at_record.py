"""A worker killed between a trial's training and its record leaves the study consistent (issue 62,
item 2): the next ``tune --study`` fails the trial (its process is gone), runs its configuration
again and completes, with no "values should be set for a complete trial" from the analysis.

The moment is made exact: the ``tune`` process kills itself (SIGKILL) at one of the three points
between the trial's result and the study holding it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from proftune.cli import app
from proftune.track import Store

OBJECTIVE = '''
def loss(params):
    return {"loss": (params["x"] - 0.2) ** 2}
'''

#: ``sitecustomize.py`` of the killed command: in every process of it (its spawned workers too),
#: trial 1 (the second) kills its process at $KILL_AT.
KILLER = '''
import os, signal

moment = os.environ.get("KILL_AT")


def die():
    os.kill(os.getpid(), signal.SIGKILL)


if moment == "trained":  # the result is in hand; nothing of it written yet
    from proftune.search._trial import TrialRunner

    finish = TrialRunner._finish

    def _finish(self, trial, rec, state, started):
        if trial.number == 1 and state == "complete":
            die()
        return finish(self, trial, rec, state, started)

    TrialRunner._finish = _finish
elif moment == "recorded":  # the study holds the trial's record; its Run is not finished
    from proftune.track import Store

    finish_run = Store.finish_run

    def _finish_run(self, run_id, **kw):
        if (kw.get("result") or {}).get("trial") == 1:
            die()
        return finish_run(self, run_id, **kw)

    Store.finish_run = _finish_run
elif moment == "told":  # the record and its Run written, the study never told the trial ended
    from optuna.storages._cached_storage import _CachedStorage
    from optuna.trial import TrialState

    tell = _CachedStorage.set_trial_state_values

    def _tell(self, trial_id, state, values=None):
        if state == TrialState.COMPLETE and self.get_trial(trial_id).number == 1:
            die()
        return tell(self, trial_id, state, values)

    _CachedStorage.set_trial_state_values = _tell
'''


@pytest.mark.parametrize(("moment", "workers"), [("trained", 1), ("recorded", 1), ("told", 1), ("told", 2)])
def test_a_worker_killed_between_training_and_record_leaves_the_study_to_continue(
        tmp_path: Path, moment: str, workers: int) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    if workers == 1:  # a plain function: the tune's own process runs its trials
        (tmp_path / "obj.py").write_text(OBJECTIVE)
        (tmp_path / "space.yaml").write_text("params:\n  x: {type: float, low: -1.0, high: 1.0}\n")
        task = [f"{tmp_path / 'obj.py'}:loss", "--objective", "loss:min"]
    else:  # a task: spawned worker processes run them, and one of those is killed
        (tmp_path / "space.yaml").write_text("params:\n  hidden: {type: int, low: 4, high: 32}\n")
        task = ["wine-mlp", "--epochs", "1"]
    args = ["tune", *task, "--space", str(tmp_path / "space.yaml"), "--trials", "4", "--sampler", "random",
            "--study", "s", "--db", db, "--workers", str(workers)]
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(KILLER)
    path = os.pathsep.join([str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])
    killed = subprocess.run([sys.executable, "-m", "proftune.cli", *args],
                            env={**os.environ, "PYTHONPATH": path, "KILL_AT": moment},
                            capture_output=True, text=True, timeout=300)
    if workers == 1:
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    else:  # the tune itself survives its killed worker, and says so
        assert killed.returncode == 1, killed.stderr
        assert "search workers ended with errors" in killed.stderr
    study = optuna.load_study(study_name="s", storage=db)
    assert study.trials[1].state == TrialState.RUNNING  # told nothing: the study cannot know it ended

    res = CliRunner().invoke(app, [*args, "--json"])  # the same command again
    assert res.exit_code == 0, res.output
    assert "values should be set" not in res.output
    out = json.loads(res.stdout)
    states = [t["state"] for t in out["trials"]]
    assert states.count("complete") == 4
    assert out["trials"][1]["state"] == "failed"
    study = optuna.load_study(study_name="s", storage=db)
    assert study.trials[1].state == TrialState.FAIL
    assert study.trials[1].values is None
    runs = {r.config.get("trial"): r for r in Store(db).list_runs(kind="trial")}
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == 1]
    # one retry; with two workers each may have found the dead trial and enqueued one (the
    # budget's surplus is dropped)
    assert 1 <= len(retries) <= workers
    dead_run = runs[1].id
    for retry in retries:
        assert retry.params == study.trials[1].params  # its configuration, enqueued again
        # run again, or (with two workers) dropped where the other worker filled the budget first;
        # either way it holds no copy of the dead trial's record (its state, its finished Run)
        assert retry.state == TrialState.COMPLETE or (workers > 1 and retry.user_attrs.get("proftune_surplus"))
        assert (retry.user_attrs.get("proftune") or {}).get("run_id") != dead_run
    assert sum(t.state == TrialState.COMPLETE for t in study.trials) == 4
    left = [(r.id, r.config, r.pid) for r in Store(db).list_runs(kind="trial") if r.status == "running"]
    assert not left, (left, killed.stderr[-2000:])  # no trial Run left running
    assert len([r for r in Store(db).list_runs(kind="tune") if r.status == "finished"]) == 1


def test_a_retry_running_in_a_live_worker_is_not_reaped_as_the_dead_trial(tmp_path: Path) -> None:
    """The retry of a trial killed after its record used to carry that record (Optuna copies the
    user attributes): a reaper in another process read it as a trial ended but never told, its
    Run's process gone, and failed it while a live worker ran it."""
    from proftune.search._storage import open_storage, reap_dead_trials

    db = f"sqlite:///{tmp_path / 'p.db'}"
    store = Store(db)
    study = optuna.create_study(study_name="s", storage=open_storage(db))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = study.ask({"x": optuna.distributions.FloatDistribution(-1.0, 1.0)})
    run_id = store.start_run("trial", "t", config={"trial": dead.number}, study="s")
    dead.set_user_attr("proftune", {"state": "complete", "run_id": run_id, "params": dict(dead.params)})
    store.finish_run(run_id, status="finished")
    store.update_run(run_id, pid=gone.pid)  # killed between its record and the tell
    assert reap_dead_trials(study, store) == [dead.number]  # failed, its configuration enqueued
    retry = study.ask()  # a live worker takes the retry
    assert retry.params == dead.params
    assert "proftune" not in retry.user_attrs
    assert reap_dead_trials(study, store) == []  # another process's reaping leaves it running
    assert study._storage.get_trial(retry._trial_id).state == TrialState.RUNNING


def test_of_two_workers_that_found_one_dead_trial_one_fails_it_and_enqueues_its_retry(tmp_path: Path) -> None:
    """Both read the trial RUNNING, then both fail it: one wins, the other is told it did not (on
    SQLite, where Optuna's row lock does nothing, both used to win and each enqueued a retry)."""
    from proftune.search._storage import fail_if_running, open_storage

    db = f"sqlite:///{tmp_path / 'p.db'}"
    study = optuna.create_study(study_name="s", storage=open_storage(db))
    trial = study.ask()
    first, second = (optuna.load_study(study_name="s", storage=open_storage(db)) for _ in range(2))
    assert first._storage.get_trial(trial._trial_id).state == second._storage.get_trial(trial._trial_id).state \
        == TrialState.RUNNING
    won = [fail_if_running(s, trial._trial_id) for s in (first, second)]
    assert won == [True, False]
    finished = optuna.load_study(study_name="s", storage=db).trials[0]
    assert finished.state == TrialState.FAIL
    assert finished.datetime_complete is not None
    assert fail_if_running(study, study.ask()._trial_id)  # the database's own trial ids, not numbers
