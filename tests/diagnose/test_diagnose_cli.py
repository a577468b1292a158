from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from proftune.cli import app

BROKEN = Path(__file__).with_name("broken_tasks.py")


def test_cli_diagnose_json_names_the_cause_first(db_url: str) -> None:
    res = CliRunner().invoke(app, ["diagnose", f"{BROKEN}:DeadReLU", "--epochs", "2", "--db", db_url, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    first = d["findings"][0]
    assert first["cause"] == "dead_units"
    assert first["severity"] == "error"
    assert first["evidence"]["layer"] == "1"
    assert first["evidence"]["zero_frac"] == 1.0
    assert first["fix"]
    assert d["run_id"] >= 1
    assert d["healthy"] is False


def test_cli_diagnose_table_and_params(db_url: str) -> None:
    res = CliRunner().invoke(app, ["diagnose", "digits-mlp", "--epochs", "2", "--param", "lr=3e-3",
                                   "--db", db_url])
    assert res.exit_code == 0, res.output
    assert "no findings" in res.stdout


def test_cli_diagnose_bad_param_exits_2(db_url: str) -> None:
    res = CliRunner().invoke(app, ["diagnose", "digits-mlp", "--param", "lr=-1", "--db", db_url])
    assert res.exit_code == 2
    assert "lr" in res.output


def test_cli_diagnose_table_shows_step_layer_and_why(db_url: str) -> None:
    """The "[step 1 layer 1]" tag was swallowed as rich markup before."""
    res = CliRunner().invoke(app, ["diagnose", f"{BROKEN}:DeadReLU", "--epochs", "1", "--db", db_url],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "[step 1 layer 1]" in res.stdout
    assert "ranked first" in res.stdout
