"""Every output option is checked before the work (exit 2, nothing run or recorded), and an
existing file or a symbolic link is replaced only with --force."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app
from proftune.track import Store

runner = CliRunner()
QUICK_PROFILE = ["profile", "digits-mlp", "--steps", "1", "--detail", "step"]


def _runs(db: str) -> int:
    return Store(db).count_runs()


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


def test_a_trace_in_a_missing_folder_exits_2_and_creates_nothing(tmp_path: Path, db: str) -> None:
    res = runner.invoke(app, [*QUICK_PROFILE, "--trace", str(tmp_path / "nonexistent" / "dir" / "t.json"),
                              "--db", db])
    assert res.exit_code == 2, res.output
    assert "does not exist" in res.output
    assert not (tmp_path / "nonexistent").exists()
    assert _runs(db) == 0  # refused before the profile, not after it


def test_a_trace_under_a_regular_file_exits_2_before_profiling(tmp_path: Path, db: str) -> None:
    (tmp_path / "afile").write_text("x")
    res = runner.invoke(app, [*QUICK_PROFILE, "--trace", str(tmp_path / "afile" / "t.json"), "--db", db])
    assert res.exit_code == 2, res.output
    assert "is a file, not a folder" in res.output
    assert _runs(db) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_trace_where_no_file_can_be_written_exits_2_without_a_cpp_log_line(db: str) -> None:
    res = runner.invoke(app, [*QUICK_PROFILE, "--trace", "/proc/t.json", "--db", db])
    assert res.exit_code == 2, res.output
    assert "not writable" in res.output
    assert "ERROR:" not in res.output
    assert _runs(db) == 0


def test_profile_keeps_existing_files_and_links_unless_forced(tmp_path: Path, db: str) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("the user's notes")
    link = tmp_path / "trace.json"
    link.symlink_to(notes)
    res = runner.invoke(app, [*QUICK_PROFILE, "--out", str(notes), "--trace", str(link), "--db", db])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    assert "--out" in text
    assert "exists" in text
    assert "symbolic link" in text
    assert "--force" in text
    assert notes.read_text() == "the user's notes"
    assert _runs(db) == 0

    out = tmp_path / "p.json"
    res = runner.invoke(app, [*QUICK_PROFILE, "--out", str(out), "--trace", str(link), "--force", "--db", db])
    assert res.exit_code == 0, res.output
    assert not link.is_symlink()
    assert link.stat().st_size > 1000
    assert notes.read_text() == "the user's notes"  # its target was not written through


def test_report_out_does_not_replace_a_file_without_force(tmp_path: Path, db: str) -> None:
    Store(db).add_runs([{"kind": "train", "task": "t", "status": "finished", "started_at": "2024-01-01T00:00:00",
                         "metrics": {"accuracy": 0.9}}])
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    res = runner.invoke(app, ["report", "1", "--out", str(notes), "--db", db])
    assert res.exit_code == 2, res.output
    assert notes.read_text() == "keep me"
    res = runner.invoke(app, ["report", "1", "--out", str(notes), "--db", db, "--force"])
    assert res.exit_code == 0, res.output
    assert notes.read_text().startswith("<!DOCTYPE html>") or "<html" in notes.read_text()[:500]


def test_every_command_checks_its_outputs_before_its_work(tmp_path: Path, db: str) -> None:
    taken = tmp_path / "taken.png"
    taken.write_bytes(b"the user's picture")
    plots = tmp_path / "plots"
    plots.mkdir()
    (plots / "history.png").write_bytes(b"the user's plot")
    (plots / "metric_vs_params.png").write_bytes(b"the user's plot")
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n")
    Store(db).add_runs([{"kind": "train", "task": "t", "status": "finished", "started_at": "2024-01-01T00:00:00"}] * 2)
    before = _runs(db)
    commands = {
        "lr-find --plot": ["lr-find", "digits-mlp", "--steps", "5", "--plot", str(taken)],
        "train --report": ["train", "digits-mlp", "--epochs", "1", "--report", str(taken)],
        "tune --plot": ["tune", "digits-mlp", "--space", str(space), "--trials", "1", "--plot", str(plots)],
        "compress --plot": ["compress", "digits-mlp", "--quantize", "dynamic", "--plot", str(plots)],
        "export --tensorboard": ["export", "1", "--tensorboard", str(taken)],
        "runs compare --report": ["runs", "compare", "1", "2", "--report", str(taken)],
    }
    for what, argv in commands.items():
        res = runner.invoke(app, [*argv, "--db", db])
        assert res.exit_code == 2, (what, res.output)
        assert "taken.png" in res.output or "plots" in res.output, (what, res.output)
    assert _runs(db) == before
    assert taken.read_bytes() == b"the user's picture"
    assert (plots / "history.png").read_bytes() == b"the user's plot"
