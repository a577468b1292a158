"""A long study stays fast: the worker loop's work before each trial does not grow with the study,
and its incremental view of the study says what a full read says."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial

import proftune
from proftune.search import load_space
from proftune.search._records import ATTR, counts, trial_records
from proftune.search._reeval import groups
from proftune.search._storage import open_storage

SPACE = {"params": {"x": {"type": "float", "low": -1.0, "high": 1.0},
                    "y": {"type": "float", "low": -1.0, "high": 1.0}}}


def _add_trials(url: str, study: str, n: int, *, seed: int = 0) -> None:
    """``n`` finished trials as the search records them, in bulk (a study grown long)."""
    space = load_space(SPACE)
    dists = {p.name: p.distribution() for p in space.params}
    rng = random.Random(seed)
    trials = []
    for i in range(n):
        params = {"x": rng.uniform(-1, 1), "y": rng.uniform(-1, 1)}
        loss = params["x"] ** 2 + params["y"] ** 2
        state = (TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)[i % 4]
        name = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed"}[state]
        rec = {"params": params, "metrics": {"loss": loss}, "state": name, "reason": None, "repeat": int(i % 9 == 0)}
        trials.append(create_trial(
            params=params, distributions=dists, state=state,
            values=[loss] if state == TrialState.COMPLETE else None,
            intermediate_values={0: loss} if state == TrialState.PRUNED else None,
            user_attrs={ATTR: rec, **({f"{ATTR}_failed": True} if state == TrialState.FAIL else {})}))
    loaded = optuna.load_study(study_name=study, storage=open_storage(url))
    loaded.add_trials(trials)


@pytest.mark.filterwarnings("ignore::proftune._deprecated.ExperimentalWarning")
def test_each_trial_is_read_once_however_long_the_study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Continuing a study of 200 trials by 12: each trial's record is built a bounded number of
    times (the loop's look before each trial reads only what changed, the analysis reads all
    once), not once per trial run (every trial again before each one)."""
    from proftune.search import _records

    url = f"sqlite:///{tmp_path / 'long.db'}"
    common: dict[str, Any] = {"objectives": ["loss:min"], "db": url, "study": "long", "sampler": "random",
                              "max_failures": 10**6}

    def fn(p: dict[str, Any]) -> dict[str, float]:
        return {"loss": p["x"] ** 2 + p["y"] ** 2}

    proftune.search(fn, SPACE, trials=2, **common)
    _add_trials(url, "long", 200)
    built = 0
    real = _records.TrialRecord

    class Counted(real):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            nonlocal built
            built += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(_records, "TrialRecord", Counted)
    done = counts(optuna.load_study(study_name="long", storage=open_storage(url)))["trained"]
    result = proftune.search(fn, SPACE, trials=done + 12, **common)
    total = len(result.trials)
    assert total >= 212
    assert sum(1 for t in result.trials if t.repeat or t.sampler == "neighbour") > 0  # the refining phase ran
    assert built <= 3 * total, (built, total)  # before: about 12 x 200 more


def test_the_incremental_view_says_what_a_full_read_says(tmp_path: Path) -> None:
    from proftune.search._records import study_view

    url = f"sqlite:///{tmp_path / 'view.db'}"
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name="v", storage=open_storage(url))
    _add_trials(url, "v", 40)
    running = study.ask()
    study.enqueue_trial({"x": 0.5, "y": 0.5})
    view = study_view(study)
    assert counts(study) == {"trained": 40, "gated": 0, "running": 1, "waiting": 1, "failed": 10}
    _add_trials(url, "v", 13, seed=1)  # trials another worker recorded since
    study.tell(running, 0.25)
    view = study_view(study)
    records = trial_records(study)
    assert counts(study) == {"trained": 54, "gated": 0, "running": 0, "waiting": 1, "failed": 13}
    full = [(dict(r.params), r.values[0]) for r in records if r.state == "complete" and r.values]
    assert view.evaluations == full
    assert view.groups.groups() == groups(full)
    assert view.repeats == sum(1 for r in records if r.repeat and r.state != "running")
    assert view.slots_before(running.number) == 40
