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


def test_a_search_plot_with_one_valued_trial_says_why_it_has_no_line() -> None:
    """21 of 22 trials pruned: the plot says so instead of showing an empty axis."""
    from proftune.optimize._output import few_values
    from proftune.optimize._records import SearchStageOutputs
    from proftune.optimize._search_records import TrialLog

    log = [TrialLog(number=0, state="COMPLETE", value=0.91)] + [
        TrialLog(number=i, state="PRUNED", reason="below the median at epoch 1") for i in range(1, 22)]
    srch = SearchStageOutputs(trials_log=log, counts={"COMPLETE": 1, "PRUNED": 21}, trials=22,
                              stop_reason="the time budget ran out")
    assert few_values(srch) == ("1 of 22 trial(s) produced a value (1 complete, 21 pruned); "
                                "the search stopped: the time budget ran out")
    log[1] = TrialLog(number=1, state="COMPLETE", value=0.93)
    assert few_values(SearchStageOutputs(trials_log=log, trials=22)) is None
