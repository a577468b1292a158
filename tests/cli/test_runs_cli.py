"""`proftune runs`: a comparison of missing runs names every one of them."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from proftune.cli import app


def test_runs_compare_names_every_missing_run(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["runs", "compare", "999998", "999999", "--db", f"sqlite:///{tmp_path / 'r.db'}"])
    assert res.exit_code == 2, res.output
    assert "999998" in res.output
    assert "999999" in res.output
