"""The patience rule: stop after `patience` reports without an improvement larger than min_delta."""

from __future__ import annotations

import optuna
import pytest

from proftune import ConfigError
from proftune.search import PatiencePruner


def _trial_with(values: list[float], direction: str = "maximize") -> tuple[optuna.Study, optuna.trial.FrozenTrial]:
    study = optuna.create_study(direction=direction)
    trial = study.ask()
    for step, v in enumerate(values):
        trial.report(v, step)
    return study, study._storage.get_trial(trial._trial_id)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_creeping_improvements_below_min_delta_are_stopped() -> None:
    # +0.001 per report, min_delta 0.01: never a real improvement after the first report
    values = [0.5 + 0.001 * i for i in range(4)]
    study, frozen = _trial_with(values)
    assert PatiencePruner(patience=3, min_delta=0.01).prune(study, frozen)
    # Optuna's PatientPruner reads min_delta as a tolerance and keeps this trial forever
    assert not optuna.pruners.PatientPruner(None, patience=3, min_delta=0.01).prune(study, frozen)


def test_waits_exactly_patience_reports() -> None:
    pr = PatiencePruner(patience=2)
    assert pr.reports_since_improvement([0.5, 0.6, 0.6], maximize=True) == 1
    assert pr.reports_since_improvement([0.5, 0.6, 0.6, 0.55], maximize=True) == 2
    study, frozen = _trial_with([0.5, 0.6, 0.6, 0.55])
    assert pr.prune(study, frozen)
    study, frozen = _trial_with([0.5, 0.6, 0.6])
    assert not pr.prune(study, frozen)
    # an improvement resets the count; NaN counts as no improvement
    assert pr.reports_since_improvement([0.5, 0.4, 0.7, float("nan")], maximize=True) == 1
    assert pr.reports_since_improvement([1.0, 0.8, 0.9, 0.95], maximize=False) == 2


def test_minimize_direction() -> None:
    study, frozen = _trial_with([1.0, 0.5, 0.52, 0.51], direction="minimize")
    assert PatiencePruner(patience=2).prune(study, frozen)
    study, frozen = _trial_with([1.0, 0.5, 0.52, 0.4], direction="minimize")
    assert not PatiencePruner(patience=2).prune(study, frozen)


def test_bad_settings_name_the_parameter() -> None:
    with pytest.raises(ConfigError, match="patience"):
        PatiencePruner(patience=0)
    with pytest.raises(ConfigError, match="min_delta"):
        PatiencePruner(patience=1, min_delta=-1.0)
