"""A disk that fills while optimize writes its outputs (issue 47): the run is ``finished`` only
after every output is written; a failed write names the file and the free space, leaves the run
``failed`` with what was kept, and ``resume`` writes the outputs and finishes it."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

import proftune
from proftune.exceptions import OutputWriteError
from proftune.track import Store

from .tasks import TinyTask


def test_a_full_disk_at_the_summary_leaves_the_run_failed_and_resume_finishes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db, out = f"sqlite:///{tmp_path / 'o.db'}", tmp_path / "o"
    write_text = Path.write_text

    def full(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        if self.name.startswith(".summary-"):  # the temporary file summary.json is written through
            write_text(self, data[:100], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OutputWriteError) as err:
        proftune.optimize(TinyTask(), budget=8, out=str(out), db=db, goal="none", seeds=1, max_trials=2)
    message = str(err.value)
    assert str(out / "summary.json") in message
    assert "No space left on device" in message
    assert "bytes free on its device" in message
    assert err.value.free_bytes is not None
    assert f"{err.value.free_bytes} bytes free" in message
    top = [r for r in Store(db).list_runs(kind="optimize") if r.parent_id is None]
    assert [r.status for r in top] == ["failed"]  # was finished, with a summary.json never written
    assert "summary.json" in (top[0].error or "")
    assert "--resume" in (top[0].error or "")
    kept = top[0].artifacts["kept"]
    assert "config.yaml" in kept
    assert "state.json" in kept
    assert "summary.json" not in kept
    assert not (out / "summary.json").exists()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".summary-")]  # no partial file left

    monkeypatch.undo()  # space again: the same command with resume writes the outputs
    result = proftune.optimize(TinyTask(), budget=8, out=str(out), db=db, goal="none", seeds=1, max_trials=2,
                               resume=True)
    assert json.loads((out / "summary.json").read_text())["files"]["summary"] == str(out / "summary.json")
    top = [r for r in Store(db).list_runs(kind="optimize") if r.parent_id is None]
    assert [(r.id, r.status) for r in top] == [(result.run_id, "finished")]
