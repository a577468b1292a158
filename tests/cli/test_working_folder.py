"""A task that changes the working folder while it runs (as Hydra does: each run in its own
``outputs/DATE/TIME`` folder) moves none of a command's relative paths: ``--db``, ``--out``,
``--plot`` and ``--report`` are resolved when the command starts (issue 62, item 5)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app
from proftune.track import Store

TASK = '''
import itertools
import os

from proftune.examples._wine import WineMLP

_N = itertools.count()


def _hop():
    """Into a fresh folder under the one the command started in, as Hydra's run folders are."""
    folder = os.path.join(os.environ["HOPS_ROOT"], f"hop-{next(_N)}")
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)


class Wandering(WineMLP):
    name = "wandering-wine"

    def build_model(self, params):
        _hop()
        return super().build_model(params)

    def train_data(self, batch_size, params):
        _hop()
        return super().train_data(batch_size, params)
'''


@pytest.fixture
def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder the command starts in, with the task file; the task hops under ``hops/``."""
    folder = tmp_path / "start"
    folder.mkdir()
    (folder / "wandering.py").write_text(TASK)
    (tmp_path / "hops").mkdir()
    monkeypatch.setenv("HOPS_ROOT", str(tmp_path / "hops"))
    monkeypatch.delenv("PROFTUNE_DB", raising=False)
    monkeypatch.chdir(folder)
    return folder


def _invoke(args: list[str], start: Path) -> str:
    """The command as a shell in ``start`` runs it (here in this process: back to ``start`` first)."""
    os.chdir(start)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert Path.cwd() != start  # the task did move this process
    return result.output


def _stray_files(tmp_path: Path) -> list[str]:
    """What the commands left in the task's own folders (nothing of theirs belongs there)."""
    return sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "hops").rglob("*") if p.is_file())


def test_train_keeps_a_relative_db_and_report_where_it_started(start: Path) -> None:
    _invoke(["train", "wandering.py", "--epochs", "1", "--db", "runs.db", "--report", "train.html"], start)
    assert (start / "train.html").is_file()
    (run,) = Store(f"sqlite:///{start / 'runs.db'}").list_runs(kind="train")
    assert run.status == "finished"
    assert _stray_files(start.parent) == []


def test_profile_keeps_its_out_report_and_default_db_where_it_started(start: Path) -> None:
    _invoke(["profile", "wandering.py", "--steps", "2", "--detail", "step", "--out", "profile.json",
             "--report", "profile.html"], start)
    assert json.loads((start / "profile.json").read_text())["schema_version"]
    assert (start / "profile.html").is_file()
    (run,) = Store(f"sqlite:///{start / 'proftune.db'}").list_runs(kind="profile")  # the default store
    assert run.status == "finished"
    assert _stray_files(start.parent) == []


def test_tune_keeps_its_study_plots_and_report_where_it_started(start: Path) -> None:
    (start / "space.yaml").write_text("params:\n  hidden: {type: categorical, choices: [8, 16]}\n")
    args = ["tune", "wandering.py", "--space", "space.yaml", "--epochs", "1",
            "--study", "hops", "--db", "sqlite:///runs.db", "--plot", "plots"]
    _invoke([*args, "--trials", "2", "--report", "tune.html"], start)
    assert (start / "tune.html").is_file()
    assert any((start / "plots").glob("*.png"))
    # the same relative study continues from where it started (to 4 trials): one store holds them all
    _invoke([*args, "--trials", "4", "--force"], start)
    store = Store(f"sqlite:///{start / 'runs.db'}")
    assert len(store.list_runs(kind="tune")) == 2
    assert len(store.list_runs(kind="trial")) == 4
    assert _stray_files(start.parent) == []
