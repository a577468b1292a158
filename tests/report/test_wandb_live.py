"""W&B as a live sink: a study's trials logged as each ends (``tune --log wandb``,
``search(on_trial=WandbTrialLogger(...))``), read back from the offline ``.wandb`` files with
wandb's own protobuf; the end-of-study export adds the study's run without repeating them."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import proftune
from proftune.cli import app
from proftune.report import WandbTrialLogger
from proftune.track import RunRecord, Store

from .test_wandb import read_offline

pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")


def _offline_runs(folder: Path) -> list[dict[str, Any]]:
    return [read_offline(d) for d in sorted((folder / "wandb").glob("offline-run-*"))]


def _when(stamp: str) -> dt.datetime:
    t = dt.datetime.fromisoformat(stamp)
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def test_tune_logs_each_trial_while_the_study_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)  # ./wandb goes here
    # per call: (trial run, its status, trial runs begun so far, the tune run's status)
    seen: list[tuple[int, str, int, str]] = []
    call = WandbTrialLogger.__call__

    def spy(self: WandbTrialLogger, record: RunRecord) -> None:
        [tune] = Store(db).list_runs(kind="tune")
        seen.append((record.id, record.status, len(Store(db).list_runs(kind="trial")), tune.status))
        call(self, record)

    monkeypatch.setattr(WandbTrialLogger, "__call__", spy)
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: categorical, choices: [8, 16]}\n")
    res = CliRunner().invoke(app, ["tune", "wine-mlp", "--space", str(space), "--trials", "3", "--epochs", "1",
                                   "--study", "live", "--log", "wandb", "--wandb-project", "team", "--json",
                                   "--device", "cpu", "--db", db])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    store = Store(db)
    tune = store.get_run(d["run_id"])
    trials = sorted(store.list_runs(kind="trial", parent_id=tune.id), key=lambda r: r.id)
    assert [t.id for t in trials] == sorted(t["run_id"] for t in d["trials"])
    assert len(trials) == 3
    # the sink was called once per trial as it ended, before the next trial began
    assert seen == [(t.id, "finished", i + 1, "running") for i, t in enumerate(trials)]
    live = [r for r in d["wandb"]["runs"] if r["live"]]
    assert [r["proftune_run"] for r in live] == [t.id for t in trials]
    assert [r["proftune_run"] for r in d["wandb"]["runs"] if not r["live"]] == [tune.id]

    got = _offline_runs(tmp_path)
    by_run: dict[int, list[dict[str, Any]]] = {}
    for g in got:
        by_run.setdefault(g["config"]["proftune.run_id"], []).append(g)
    # one W&B run per trial and one for the study: nothing logged twice
    assert sorted(by_run) == sorted([tune.id, *(t.id for t in trials)])
    assert all(len(v) == 1 for v in by_run.values())
    assert {g["run"]["group"] for g in got} == {"live"}
    assert {g["run"]["project"] for g in got} == {"team"}
    tune_ended = _when(tune.ended_at or "")
    for t in trials:
        [g] = by_run[t.id]
        assert g["run"]["job_type"] == "trial"
        assert g["config"]["hidden"] == t.config["params"]["hidden"]
        assert g["summary"]["accuracy"] == pytest.approx(t.metrics["accuracy"])
        assert [row["epoch"] for row in g["history"] if "epoch/accuracy" in row] == [1]
        assert g["exit_code"] == 0
        # written after its trial ended, before the next one began and the study's run ended
        assert _when(t.ended_at or "") <= g["run"]["start_time"] < tune_ended
    for t, after in itertools.pairwise(trials):
        assert by_run[t.id][0]["run"]["start_time"] <= _when(after.started_at)
    [study_run] = by_run[tune.id]
    assert study_run["run"]["job_type"] == "tune"
    # the study's run is one of the command's outputs: logged once its last trial ended; the tune's
    # Run is finished only once its outputs are written (issue 47), and records the end of its work,
    # which came before them (issue 63: the report shows that end and that duration)
    assert max(_when(t.ended_at or "") for t in trials) <= study_run["run"]["start_time"]
    assert tune.status == "finished"


def test_a_failed_trial_is_logged_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library API: a plain objective whose one configuration raises; the failed trial is a
    W&B run with exit code 1 and tag ``status:failed``, in the study's group like the others."""
    monkeypatch.setenv("WANDB_MODE", "offline")  # wandb keeps its first settings for later tests too
    monkeypatch.setenv("WANDB_SILENT", "true")

    def objective(p: dict[str, Any]) -> float:
        if p["x"] == 2:
            raise ValueError("x=2 is broken")
        return float(p["x"])

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    sink = WandbTrialLogger("failures", dir=tmp_path, mode="offline")
    result = proftune.search(objective, {"params": {"x": {"type": "categorical", "choices": [1, 2, 3]}}},
                             objectives=["value:min"], trials=3, sampler="grid", study="fails", db=db, on_trial=sink)
    assert sorted(t.state for t in result.trials) == ["complete", "complete", "failed"]
    assert sink.errors == []
    assert sink.run_ids == {t.run_id for t in result.trials}
    got = {g["config"]["proftune.run_id"]: g for g in _offline_runs(tmp_path)}
    assert set(got) == sink.run_ids
    for t in result.trials:
        g = got[t.run_id]
        assert g["run"]["group"] == "fails"
        assert g["exit_code"] == (1 if t.state == "failed" else 0)
        assert ("status:failed" in g["run"]["tags"]) == (t.state == "failed")
    # the study's run afterwards, its trials skipped
    out = proftune.report.export_wandb(result.run_id, project="failures", dir=tmp_path, mode="offline", db=db,
                                       report=False, skip=sink.run_ids)
    assert [o["proftune_run"] for o in out] == [result.run_id]


def test_a_trial_wandb_refuses_is_left_to_the_final_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B online with no account refuses every run: the study still ends, the sink says which
    trials it could not log, and the end-of-study export (offline here) logs them after all."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))  # no stored login
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    sink = WandbTrialLogger("refused", dir=tmp_path, mode="online")
    result = proftune.search(lambda p: float(p["x"]), {"params": {"x": {"type": "categorical", "choices": [1, 2]}}},
                             objectives=["value:min"], trials=2, sampler="grid", study="refused", db=db,
                             on_trial=sink)
    assert [run for run, _ in sink.errors] == sorted(t.run_id for t in result.trials)
    assert all(error.startswith("UsageError") for _, error in sink.errors), sink.errors
    assert sink.logged == []
    assert sink.run_ids == set()
    out = proftune.report.export_wandb(result.run_id, project="refused", dir=tmp_path, mode="offline", db=db,
                                       report=False, skip=sink.run_ids)
    assert [o["proftune_run"] for o in out] == [result.run_id, *sorted(t.run_id for t in result.trials)]
