"""``out=`` that cannot be a folder is refused before any work, naming the problem (issue 47):
an empty name (it used to mean the default silently) and a dangling symbolic link (it used to
fail at the folder lock with a FileExistsError)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import proftune
from proftune.exceptions import ConfigError

from .tasks import TinyTask


@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused(out: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"out='\s*' is empty: name a folder, or leave it out for the default"):
        proftune.optimize(TinyTask(), budget=10, out=out, db=f"sqlite:///{tmp_path / 'o.db'}", goal="none")
    assert not (tmp_path / "proftune-optimize").exists()


def test_a_dangling_symlink_out_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    link = tmp_path / "out"
    os.symlink(tmp_path / "gone", link)
    with pytest.raises(ConfigError, match=r"is a symbolic link to .*gone', which does not exist"):
        proftune.optimize(TinyTask(), budget=10, out=str(link), db=f"sqlite:///{tmp_path / 'o.db'}", goal="none")
    assert link.is_symlink()
    assert not (tmp_path / "gone").exists()
