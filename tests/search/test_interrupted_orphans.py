"""A worker stopped between Optuna's start of a trial and its Run leaves an Optuna trial RUNNING
that no Run names (the clean-clone CI of this round saw it once, at load): the interrupted
search fails it as interrupted, unless another tune shares the study."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from proftune.search._backends import _record_interrupted
from proftune.search._storage import open_storage
from proftune.track import Store


@pytest.mark.parametrize("other_tune", [False, True])
def test_an_optuna_trial_with_no_run_is_failed_as_interrupted_where_the_study_is_ours(
        tmp_path: Path, other_tune: bool) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    store = Store(db)
    study = optuna.create_study(study_name="s", storage=open_storage(db))
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    ours = store.start_run("tune", "t", study="s")
    if other_tune:
        store.start_run("tune", "t", study="s")
    _record_interrupted(SimpleNamespace(db=db, study="s", tune_run_id=ours), [999_999])  # type: ignore[arg-type]
    states = optuna.trial.TrialState
    after = optuna.load_study(study_name="s", storage=db)
    got = after.trials[trial.number]
    if other_tune:  # another tune's trial may be between its start and its Run: left alone
        assert got.state == states.RUNNING
        return
    assert got.state == states.FAIL
    assert got.user_attrs.get("interrupted") is True
    queued = [t for t in after.trials if t.state == states.WAITING]
    assert len(queued) == 1
    assert not queued[0].user_attrs.get("interrupted")
