"""An optimize run's records tell the truth at every moment (issue 62): each stage's runs end
with the stage, with their own status and end time, inside the command's hold on its outputs; a
resumed run is this process's, so no sweep of stale runs marks it failed; after Ctrl-C the
finished stages stay finished."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import proftune
from proftune.track import Store, held_until_written

from .tasks import TinyTask


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stage_runs_end_with_their_stage_and_an_interrupt_leaves_them_finished(tmp_path: Path) -> None:
    db, out = f"sqlite:///{tmp_path / 'o.db'}", tmp_path / "o"
    seen: dict[str, Any] = {}

    def stop(run: Any) -> None:  # the first search trial's end: what the store says now, then Ctrl-C
        runs = Store(db).list_runs()
        seen["open"] = [(r.id, r.kind, r.config.get("stage")) for r in runs if r.status == "running"]
        seen["ended"] = {r.id: r.ended_at for r in runs if r.status == "finished"}
        raise KeyboardInterrupt("signal SIGINT")

    with pytest.raises(KeyboardInterrupt), held_until_written([out]):  # as the command runs it
        proftune.optimize(TinyTask(), budget=30, out=str(out), db=db, goal="none", on_trial=stop)
    store = Store(db)
    top = [r for r in store.list_runs(kind="optimize") if r.parent_id is None]
    # while the search runs: the optimize run, its search stage, the tune run and the trial
    # Run just finished; every earlier stage's runs (diagnose, profile, recommend, ...) ended
    kinds = sorted(k for _, k, _ in seen["open"])
    assert kinds == ["optimize", "optimize", "tune"], seen["open"]
    assert len(seen["ended"]) >= 4
    after = {r.id: r for r in store.list_runs()}
    for run_id, ended in seen["ended"].items():  # still finished, at the time they ended
        assert after[run_id].status == "finished", (after[run_id].kind, after[run_id].error)
        assert after[run_id].ended_at == ended
        assert "kept" not in (after[run_id].error or "")
    assert [r.status for r in top] == ["interrupted"]
    state = json.loads((out / "state.json").read_text())
    for name in ("baseline", "health", "compute"):
        assert state["stages"][name]["status"] == "finished"


def test_a_resumed_optimize_is_finished_though_a_sweep_ran_during_it(tmp_path: Path) -> None:
    db, out = f"sqlite:///{tmp_path / 'o.db'}", tmp_path / "o"

    def stop(run: Any) -> None:
        raise KeyboardInterrupt("signal SIGTERM")

    with pytest.raises(KeyboardInterrupt), held_until_written([out]):
        proftune.optimize(TinyTask(), budget=30, out=str(out), db=db, goal="none", on_trial=stop)
    store = Store(db)
    first = next(r for r in store.list_runs(kind="optimize") if r.parent_id is None)
    store.update_run(first.id, pid=_dead_pid())  # the first process is gone
    swept: list[str] = []

    def sweep(run: Any) -> None:  # a concurrent `runs list` sweeps stale runs in the middle
        Store(db).reap_stale()
        swept.append(Store(db).get_run(first.id).status)

    with held_until_written([out]):
        result = proftune.optimize(TinyTask(), budget=30, out=str(out), db=db, goal="none", resume=True,
                                   on_trial=sweep)
    assert result.run_id == first.id
    assert swept
    assert set(swept) == {"running"}
    final = store.get_run(first.id)
    assert (final.status, final.error) == ("finished", None)
    assert final.ended_at is not None
    reused = [r for r in store.list_runs(kind="optimize") if r.parent_id == first.id and r.status != "finished"]
    assert [(r.config.get("stage"), r.status) for r in reused] == [("search", "interrupted")]


def test_a_full_disk_fails_the_optimize_run_only_and_resume_finishes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from proftune.exceptions import OutputWriteError

    db, out = f"sqlite:///{tmp_path / 'o.db'}", tmp_path / "o"
    write_text = Path.write_text

    def full(self: Path, data: str, *args: Any, **kwargs: Any) -> int:
        if self.name.startswith(".summary-"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    kw: dict[str, Any] = {"budget": 8, "out": str(out), "db": db, "goal": "none", "seeds": 1, "max_trials": 2}
    with pytest.raises(OutputWriteError), held_until_written([out]):
        proftune.optimize(TinyTask(), **kw)
    store = Store(db)
    failed = [(r.kind, r.config.get("stage")) for r in store.list_runs() if r.status == "failed"]
    assert failed == [("optimize", None)]  # before: every run of every stage, held until the end
    monkeypatch.undo()
    with held_until_written([out]):
        result = proftune.optimize(TinyTask(), **kw, resume=True)
    assert {r.status for r in store.list_runs()} == {"finished"}
    assert store.get_run(result.run_id).error is None
