"""`proftune tune --log wandb`: the study, the tune run and its trials, as runs of one W&B group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app
from proftune.track import Store

pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")


def test_tune_logs_its_study_to_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)  # ./wandb goes here
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: categorical, choices: [8, 16]}\n")
    res = CliRunner().invoke(app, ["tune", "wine-mlp", "--space", str(space), "--trials", "2", "--epochs", "1",
                                   "--study", "wb", "--log", "wandb", "--wandb-project", "tw", "--json",
                                   "--db", f"sqlite:///{tmp_path / 'runs.db'}"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    runs = d["wandb"]["runs"]
    assert len(runs) == 1 + len(d["trials"])
    wandb.teardown()  # the service writes the offline files out
    for r in runs:
        assert Path(r["dir"]).parent == tmp_path / "wandb"
        assert list(Path(r["dir"]).glob("run-*.wandb"))
    bad = CliRunner().invoke(app, ["tune", "wine-mlp", "--space", str(space), "--log", "neptune",
                                   "--db", f"sqlite:///{tmp_path / 'runs.db'}"])
    assert bad.exit_code == 2
    assert "valid: wandb" in bad.output


@pytest.mark.slow  # ~25 s: a whole optimize loop; tune's test above covers the sink itself
def test_optimize_logs_its_run_and_stages_to_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same sink for optimize: its search trials as they end, then its run and the runs it
    started (each stage's) as one group, checked before the loop starts."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    bad = CliRunner().invoke(app, ["optimize", "wine-mlp", "--budget", "20s", "--log", "tensorboard", "--db", db,
                                   "--out", str(tmp_path / "never")])
    assert bad.exit_code == 2
    assert "valid: wandb" in bad.output
    assert not (tmp_path / "never").exists()
    res = CliRunner().invoke(app, ["optimize", "wine-mlp", "--budget", "20s", "--goal", "none", "--log", "wandb",
                                   "--wandb-project", "ow", "--out", str(tmp_path / "o"), "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    runs = d["wandb"]["runs"]
    assert d["wandb"]["project"] == "ow"
    assert len(runs) > len(d["stages"])  # the optimize run and at least each stage's
    store = Store(db)
    opt = store.get_run(runs[0]["proftune_run"])  # the run first
    assert (opt.kind, opt.parent_id) == ("optimize", None)
    trials = store.list_runs(kind="trial", study=opt.study)
    assert trials, "the search stage ran trials"
    # every search trial logged live, once; the end-of-run export adds the rest, none twice
    assert sorted(r["proftune_run"] for r in runs if r["live"]) == sorted(t.id for t in trials)
    assert len({r["proftune_run"] for r in runs}) == len(runs)
    wandb.teardown()
    assert all(list(Path(r["dir"]).glob("run-*.wandb")) for r in runs)
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == len(runs)


BROKEN = '''
from proftune.examples._wine import WineMLP


class Broken(WineMLP):
    name = "broken-wine"

    def evaluate(self, model, data):
        raise ValueError("my evaluate is broken")
'''


@pytest.mark.parametrize("max_failures", [5, 0])
def test_a_tune_whose_trials_all_failed_still_logs_its_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           max_failures: int) -> None:
    """Every trial failed (within --max-failures: exit 1 after the search; beyond it: the search
    itself stops): the team's W&B project still gets the failed study and each failed trial."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    task = tmp_path / "broken.py"
    task.write_text(BROKEN)
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: categorical, choices: [8, 16]}\n")
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    res = CliRunner().invoke(app, ["tune", str(task), "--space", str(space), "--trials", "2", "--epochs", "1",
                                   "--max-failures", str(max_failures), "--log", "wandb", "--wandb-project", "tf",
                                   "--db", db])
    assert res.exit_code == 1, res.output
    assert "my evaluate is broken" in res.stderr
    store = Store(db)
    tune = store.list_runs(kind="tune")[0]
    trials = store.list_runs(kind="trial", parent_id=tune.id)
    assert trials
    assert all(t.status == "failed" for t in trials)
    wandb.teardown()
    logged = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(logged) == 1 + len(trials), logged  # the study's run and each failed trial, once
    assert all(list(d.glob("run-*.wandb")) for d in logged)


def test_an_optimize_that_fails_midway_still_logs_its_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop fails in a stage (the user's evaluate raises): exit 1 with that error, and the
    team's W&B project still gets the failed optimize run and the failed stage."""
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    task = tmp_path / "broken.py"
    task.write_text(BROKEN)
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    res = CliRunner().invoke(app, ["optimize", str(task), "--budget", "20s", "--goal", "none", "--log", "wandb",
                                   "--wandb-project", "of", "--out", str(tmp_path / "o"), "--db", db])
    assert res.exit_code == 1, res.output
    assert "my evaluate is broken" in res.stderr
    store = Store(db)
    top = [r for r in store.list_runs(kind="optimize") if r.parent_id is None]
    assert [r.status for r in top] == ["failed"]
    runs = [r for r in store.list_runs() if top[0].id in (r.id, r.parent_id)]
    assert any(r.status == "failed" and r.parent_id == top[0].id for r in runs), "the stage that failed"
    wandb.teardown()
    logged = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(logged) >= len(runs), (logged, runs)  # the run, its stages (and any trial), each once
    assert all(list(d.glob("run-*.wandb")) for d in logged)
