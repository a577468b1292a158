"""`proftune tune --log wandb`: the study, the tune run and its trials, as runs of one W&B group."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app

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
