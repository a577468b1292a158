"""A store that cannot be written is refused before any work (exit 2), with one message that says
the location is read-only and what to do: no SQL statement, no parameters, no environment JSON.

Permission bits do not stop root, so as root the file or folder is made immutable (``chattr +i``:
root cannot write it either); where that is not allowed the test skips and says why."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app
from proftune.track import Store


@pytest.fixture
def make_read_only() -> Iterator[Callable[[Path], None]]:
    """Make a file or folder read-only for this process, whoever it runs as; undone afterwards."""
    done: list[tuple[Path, int, bool]] = []

    def read_only(path: Path) -> None:
        mode = path.stat().st_mode
        if os.geteuid() != 0:
            path.chmod(0o555 if path.is_dir() else 0o444)
            done.append((path, mode, False))
            return
        try:
            subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or exc
            pytest.skip(f"running as root, whom chmod does not stop, and chattr +i is not possible here ({detail})")
        done.append((path, mode, True))

    yield read_only
    for path, mode, immutable in reversed(done):
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(stat.S_IMODE(mode))


def _assert_one_clear_message(output: str, *, names: str) -> None:
    assert "read-only" in output, output
    assert names in output, output
    assert "--db" in output, output  # what to do: another location ...
    assert "chmod" in output, output  # ... or make it writable
    for raw in ("[SQL:", "[parameters:", '"python":', "INSERT", "UPDATE", "sqlalche.me", "Traceback"):
        assert raw not in output, (raw, output)


def test_an_immutable_database_file_is_refused_with_what_to_do(tmp_path: Path, make_read_only) -> None:
    db = tmp_path / "runs.db"
    store = Store(f"sqlite:///{db}")
    store.start_run("train", "wine-mlp")
    store.engine.dispose()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    make_read_only(db)
    res = CliRunner().invoke(app, ["train", "wine-mlp", "--max-steps", "2", "--device", "cpu", "--db", f"sqlite:///{db}"])
    assert res.exit_code == 2, res.output
    _assert_one_clear_message(res.output, names=str(db))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_new_database_in_a_read_only_folder_is_refused_with_what_to_do(tmp_path: Path, make_read_only) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    make_read_only(folder)
    res = CliRunner().invoke(app, ["train", "wine-mlp", "--max-steps", "2", "--device", "cpu",
                                   "--db", f"sqlite:///{folder / 'new.db'}"])
    assert res.exit_code == 2, res.output
    _assert_one_clear_message(res.output, names=str(folder))
    assert "unable to open database file" not in res.output
    assert list(folder.iterdir()) == []


def test_a_database_made_read_only_while_open_says_so(tmp_path: Path, make_read_only) -> None:
    from proftune.exceptions import StoreError

    db = tmp_path / "runs.db"
    store = Store(f"sqlite:///{db}")
    store.start_run("train", "wine-mlp")
    store.engine.dispose()
    make_read_only(db)
    with pytest.raises(StoreError, match="read-only") as info:
        store.start_run("train", "wine-mlp")
    assert "INSERT" not in str(info.value)
