"""`proftune runs`: a comparison of missing runs names every one of them; a bad --db is named as the flag."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app


def test_runs_compare_names_every_missing_run(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["runs", "compare", "999998", "999999", "--db", f"sqlite:///{tmp_path / 'r.db'}"])
    assert res.exit_code == 2, res.output
    assert "999998" in res.output
    assert "999999" in res.output


@pytest.mark.parametrize(("db", "problem"), [
    ("not a url", "is not a database URL"),
    ("sqlite:///{tmp}", "points at a directory"),
    ("sqlite:///{tmp}/no/r.db", "folder '{tmp}/no' does not exist"),
    ("sqlite:///{tmp}/notes.db", "'{tmp}/notes.db' exists and is not a SQLite database"),
])
def test_a_bad_db_is_named_as_the_flag(tmp_path: Path, db: str, problem: str) -> None:
    """The store names the URL as db= (the library's argument); the command line reads --db."""
    (tmp_path / "notes.db").write_text("mine")
    db, problem = db.format(tmp=tmp_path), problem.format(tmp=tmp_path)
    res = CliRunner().invoke(app, ["runs", "list", "--db", db])
    assert res.exit_code == 2, res.output
    assert f"--db {db!r}" in res.output, res.output
    assert problem in res.output, res.output
    assert "db=" not in res.output
    assert (tmp_path / "notes.db").read_text() == "mine"
