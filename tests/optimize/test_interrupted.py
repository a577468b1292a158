"""Ctrl-C or SIGTERM in the middle of optimize (a KeyboardInterrupt, as the CLI raises it) is
recorded ``interrupted``, not ``failed``: the optimize run, the stage it stopped in, and the
stage's block of ``state.json`` (issue 47); ``--resume`` runs that stage again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import proftune
from proftune.track import Store

from .tasks import TinyTask


def test_an_interrupt_in_the_search_is_recorded_interrupted_everywhere(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'o.db'}"

    def stop(run: Any) -> None:  # the first search trial's end: a signal arrives
        raise KeyboardInterrupt("signal SIGTERM")

    with pytest.raises(KeyboardInterrupt):
        proftune.optimize(TinyTask(), budget=30, out=str(tmp_path / "o"), db=db, goal="none", on_trial=stop)
    runs = Store(db).list_runs(kind="optimize")
    top = [r for r in runs if r.parent_id is None]
    assert [r.status for r in top] == ["interrupted"]
    by_stage = {r.config.get("stage"): r.status for r in runs if r.parent_id is not None}
    assert by_stage["search"] == "interrupted"
    assert {by_stage[s] for s in ("baseline", "health", "compute")} == {"finished"}
    state = json.loads((tmp_path / "o" / "state.json").read_text())
    assert state["stages"]["search"]["status"] == "interrupted"
    assert "KeyboardInterrupt" in state["stages"]["search"]["error"]
