"""`proftune report`, `--report` on a command, `runs compare --report`, `proftune export`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app
from proftune.exceptions import ConfigError
from proftune.report import export_mlflow, render_report, write_compare_report, write_report
from proftune.track import Store

runner = CliRunner()


def test_report_a_run_a_study_and_a_profile(store: Store, runs: dict[str, int], db_url: str,
                                            tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", str(runs["diagnose"]), "--out", str(out), "--db", db_url, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["report"] == str(out)
    assert d["bytes"] == out.stat().st_size
    assert "lr_too_high" in out.read_text()
    res = runner.invoke(app, ["report", "--study", "s1", "--out", str(tmp_path / "s.html"), "--db", db_url])
    assert res.exit_code == 0, res.output
    assert "Pareto front" in (tmp_path / "s.html").read_text()
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps(store.get_run(runs["profile"]).result))
    res = runner.invoke(app, ["report", str(profile), "--out", str(tmp_path / "p.html")])
    assert res.exit_code == 0, res.output


def test_report_bad_input_exits_2_and_names_it(store: Store, runs: dict[str, int], db_url: str,
                                              tmp_path: Path) -> None:
    res = runner.invoke(app, ["report", "--db", db_url])
    assert res.exit_code == 2
    assert "exactly one" in res.output
    res = runner.invoke(app, ["report", "--study", "nope", "--db", db_url])
    assert res.exit_code == 2
    assert "--study 'nope' has no runs" in res.output  # the library's study='nope', read as the flag
    assert "s1" in res.output
    res = runner.invoke(app, ["report", "999", "--db", db_url])
    assert res.exit_code == 2
    assert "999" in res.output
    res = runner.invoke(app, ["report", str(runs["train"]), "--out", str(tmp_path / "no" / "r.html"),
                              "--db", db_url])
    assert res.exit_code == 2
    assert "does not exist" in res.output
    (tmp_path / "taken.html").write_text("mine")
    res = runner.invoke(app, ["report", str(runs["train"]), "--out", str(tmp_path / "taken.html"), "--db", db_url])
    assert res.exit_code == 2
    assert f"--out {str(tmp_path / 'taken.html')!r} exists; pass --force" in " ".join(res.output.split())
    assert (tmp_path / "taken.html").read_text() == "mine"


def test_the_library_names_its_arguments_the_cli_its_flags(store: Store, runs: dict[str, int], db_url: str,
                                                            tmp_path: Path) -> None:
    """write_report(out=...), write_compare_report(a, b, out), render_report(study=...),
    export_mlflow(run, uri): the Python call
    reads its argument; the same mistake on the command line reads --out, --study, --mlflow."""
    taken = tmp_path / "taken.html"
    taken.write_text("mine")
    for call, message in ((lambda: write_report(runs["train"], taken, store=store, force=False),
                           f"out={str(taken)!r} exists"),
                          (lambda: write_compare_report(runs["train"], runs["diagnose"], taken, store=store,
                                                        force=False), f"out={str(taken)!r} exists"),
                          (lambda: render_report(study="nope", store=store), "study='nope' has no runs"),
                          (lambda: export_mlflow(runs["train"], "", store=store), "uri='' is not a tracking URI")):
        with pytest.raises(ConfigError) as err:
            call()
        assert str(err.value).startswith(message), str(err.value)
    res = runner.invoke(app, ["export", str(runs["train"]), "--mlflow", "", "--db", db_url])
    assert res.exit_code == 2, res.output
    assert "--mlflow '' is not a tracking URI" in res.output
    assert taken.read_text() == "mine"


def test_train_with_report_writes_the_run_page(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "train.html"
    res = runner.invoke(app, ["train", "digits-mlp", "--max-steps", "3", "--db", db_url, "--json",
                              "--report", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    html = out.read_text()
    assert f"(run {d['run_id']})" in html
    assert "loss per step" in html
    res = runner.invoke(app, ["train", "digits-mlp", "--max-steps", "1", "--db", db_url,
                              "--report", str(tmp_path / "missing" / "x.html")])
    assert res.exit_code == 2
    assert "--report" in res.output


def test_runs_compare_report(store: Store, runs: dict[str, int], db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "cmp.html"
    res = runner.invoke(app, ["runs", "compare", str(runs["train"]), str(runs["diagnose"]), "--db", db_url,
                              "--json", "--report", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["a"] == runs["train"]
    assert "loss per step" in out.read_text()


def test_export_needs_a_target(runs: dict[str, int], db_url: str) -> None:
    res = runner.invoke(app, ["export", str(runs["train"]), "--db", db_url])
    assert res.exit_code == 2
    assert "--tensorboard" in res.output


@pytest.mark.parametrize("content", ['{"layers": "x"}', "{}", '{"task": "t", "params": {}, "layers": [1]}'])
def test_a_json_that_is_no_profile_exits_2_naming_what_a_profile_holds(tmp_path: Path, content: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weird.json").write_text(content)
    res = CliRunner().invoke(app, ["report", "weird.json", "--out", str(tmp_path / "w.html")])
    assert res.exit_code == 2, res.output
    assert "not a profile" in res.output
    assert "'layers' (a list of layer objects)" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weird.json"]
