"""A disk that fills while a command writes its outputs (issue 47): the command's Run is
``finished`` only once every output is written; a failed write names the file and its device's
free space, exits 1, and leaves the Run ``failed`` with what was kept."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from proftune.cli import app
from proftune.track import Store

runner = CliRunner()
SCRIPTS = Path(__file__).parent / "scripts"


def _full_at(monkeypatch: pytest.MonkeyPatch, name: str, db: str) -> list[list[str]]:
    """A full disk when the file ``name`` is put in place (every output goes through
    ``_paths.replacing``: a temporary file renamed over it); returns, per failed write, the
    statuses of the store's top-level runs at that moment."""
    replace: Callable[..., Any] = os.replace
    seen: list[list[str]] = []

    def full(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if Path(dst).name == name:
            seen.append([r.status for r in Store(db).list_runs() if r.parent_id is None])
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full)
    return seen


def _check_failed(res: Any, target: Path, db: str, seen: list[list[str]], *, kind: str) -> Any:
    assert res.exit_code == 1, res.output
    text = " ".join(res.output.split())
    assert str(target) in text
    assert "No space left on device" in text
    assert "bytes free on its device" in text
    assert seen
    assert "finished" not in seen[0]
    runs = [r for r in Store(db).list_runs(kind=kind) if r.parent_id is None]
    assert [r.status for r in runs] == ["failed"]  # was finished, with an output never written
    record = Store(db).get_run(runs[0].id)
    assert str(target) in (record.error or "")
    assert "bytes free" in (record.error or "")
    assert record.ended_at is not None
    assert "kept" in record.artifacts
    assert not [p for p in target.parent.iterdir() if p.name.startswith(f".{target.stem}-")]  # no partial file
    return record


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def test_profile_out_on_a_full_disk_leaves_its_run_failed(tmp_path: Path, db: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    out, trace = tmp_path / "p.json", tmp_path / "trace.json"
    seen = _full_at(monkeypatch, "p.json", db)
    res = runner.invoke(app, ["profile", "digits-mlp", "--steps", "1", "--detail", "step", "--out", str(out),
                              "--db", db])
    record = _check_failed(res, out, db, seen, kind="profile")
    assert record.artifacts["kept"] == []
    assert record.result  # the profile measured is kept in the store
    assert not out.exists()
    assert not trace.exists()


def test_profile_report_written_then_finished(tmp_path: Path, db: str) -> None:
    out, report = tmp_path / "p.json", tmp_path / "p.html"
    res = runner.invoke(app, ["profile", "digits-mlp", "--steps", "1", "--detail", "step", "--out", str(out),
                              "--report", str(report), "--db", db])
    assert res.exit_code == 0, res.output
    [run] = Store(db).list_runs(kind="profile")
    assert run.status == "finished"
    assert ">finished<" in report.read_text()  # the report reads the run as it is recorded once written
    assert ">running<" not in report.read_text()


def test_train_report_on_a_full_disk_leaves_its_run_failed(tmp_path: Path, db: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "t.html"
    seen = _full_at(monkeypatch, "t.html", db)
    res = runner.invoke(app, ["train", "digits-mlp", "--epochs", "1", "--max-steps", "3", "--report", str(report),
                              "--db", db])
    record = _check_failed(res, report, db, seen, kind="train")
    assert record.metrics  # what was trained is kept in the store


def test_compress_report_on_a_full_disk_keeps_the_model_and_fails_the_run(tmp_path: Path, db: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    out, report = tmp_path / "m.pt", tmp_path / "c.html"
    seen = _full_at(monkeypatch, "c.html", db)
    res = runner.invoke(app, ["compress", "digits-mlp", "--quantize", "dynamic", "--out", str(out),
                              "--report", str(report), "--db", db])
    record = _check_failed(res, report, db, seen, kind="compress")
    assert record.artifacts["kept"] == [str(out)]
    assert str(out) in (record.error or "")
    assert out.is_file()


def test_tune_report_on_a_full_disk_leaves_its_run_failed(tmp_path: Path, db: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    space, report, plots = tmp_path / "s.yaml", tmp_path / "tune.html", tmp_path / "plots"
    space.write_text("params:\n  lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n")
    seen = _full_at(monkeypatch, "tune.html", db)
    res = runner.invoke(app, ["tune", "digits-mlp", "--space", str(space), "--trials", "1", "--epochs", "1",
                              "--plot", str(plots), "--report", str(report), "--db", db])
    record = _check_failed(res, report, db, seen, kind="tune")
    assert record.artifacts["kept"]
    assert all(k.startswith(str(plots)) for k in record.artifacts["kept"])


def test_tune_plot_on_a_full_disk_leaves_its_run_failed(tmp_path: Path, db: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    space, plots = tmp_path / "s.yaml", tmp_path / "plots"
    space.write_text("params:\n  lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n")
    seen = _full_at(monkeypatch, "history.png", db)
    res = runner.invoke(app, ["tune", "digits-mlp", "--space", str(space), "--trials", "1", "--epochs", "1",
                              "--plot", str(plots), "--db", db])
    assert res.exit_code == 1, res.output
    text = " ".join(res.output.split())
    assert str(plots / "history.png") in text
    assert "bytes free on its device" in text
    assert seen
    assert "finished" not in seen[0]
    assert [r.status for r in Store(db).list_runs(kind="tune")] == ["failed"]


def test_run_out_on_a_full_disk_leaves_its_run_failed(tmp_path: Path, db: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "w.json"
    seen = _full_at(monkeypatch, "w.json", db)
    res = runner.invoke(app, ["run", "--every", "5", "--out", str(out), "--db", db, "--",
                              "python", str(SCRIPTS / "plain_loop.py"), "--steps", "10"])
    record = _check_failed(res, out, db, seen, kind="profile")
    assert record.result  # the sampled profile is kept in the store
