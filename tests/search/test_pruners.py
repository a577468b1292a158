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


class _State:
    """The part of a FitState the pruning callback reads."""

    def __init__(self, epoch: int, value: float) -> None:
        self.epoch, self.metrics, self.stopped = epoch, {"accuracy": value}, None

    def request_stop(self, reason: str) -> None:
        self.stopped = reason


def _asha_runs(curves: list[list[float]], *, every_epoch: bool) -> tuple[list[int | None], list[list[int]]]:
    """The epoch each curve's trial was pruned at (None: completed) and the epochs it reported, under
    ASHA (first rung 1, factor 3), through proftune's callback or with a report at every epoch."""
    from proftune.search._trial import _PruningCallback

    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.SuccessiveHalvingPruner(
        min_resource=1, reduction_factor=3))
    pruned: list[int | None] = []
    for curve in curves:
        trial = study.ask()
        cb = _PruningCallback(trial, "accuracy", "asha")
        if every_epoch:
            cb.rungs = None
        at = None
        for epoch, v in enumerate(curve, start=1):
            state = _State(epoch, v)
            cb.on_epoch_end(state)  # type: ignore[arg-type]
            if state.stopped:
                at = epoch
                break
        pruned.append(at)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED) if at else study.tell(trial, curve[-1])
    return pruned, [sorted(t.intermediate_values) for t in study.trials]


def test_asha_trials_report_at_their_rungs_only_and_are_pruned_as_before() -> None:
    """A report is a database write and a read of the trial (20-30 ms on SQLite, 16% of the search
    stage's training on noisy-labels digits, issue 60); successive halving reads rungs only."""
    import random

    rng = random.Random(0)
    curves = [[min(1.0, rng.random() * 0.3 + 0.05 * e * rng.random()) for e in range(10)] for _ in range(30)]
    rungs, reported = _asha_runs(curves, every_epoch=False)
    every, reported_every = _asha_runs(curves, every_epoch=True)
    assert rungs == every  # the same trials pruned at the same epochs
    assert any(p is not None for p in rungs)
    assert any(p is None for p in rungs)
    for steps, all_steps in zip(reported, reported_every, strict=True):
        assert set(steps) <= {1, 3, 9}
        assert steps == [s for s in all_steps if s in (1, 3, 9)]


def test_rung_epochs_only_for_successive_halving_with_a_known_first_rung() -> None:
    from proftune.search._trial import rung_epochs

    at = rung_epochs(optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=3))
    assert at is not None
    assert [e for e in range(1, 30) if at(e)] == [2, 6, 18]
    assert rung_epochs(optuna.pruners.SuccessiveHalvingPruner(min_resource="auto")) is None
    assert rung_epochs(optuna.pruners.MedianPruner()) is None
    assert rung_epochs(optuna.pruners.HyperbandPruner()) is None


@pytest.mark.parametrize(("margin", "pruned"), [(0.0, [False, True, True]), (0.035, [False, False, True])])
def test_noise_aware_halving_prunes_only_beyond_its_margin(margin: float, pruned: list[bool]) -> None:
    """At the first rung, the first trial is the cut; 0.02 behind it is within one validation figure's
    noise (0.035 on 200 samples) and goes on, 0.10 behind is pruned; margin 0 is Optuna's halving."""
    from proftune.search._pruners import NoiseAwareHalvingPruner

    study = optuna.create_study(direction="maximize",
                                pruner=NoiseAwareHalvingPruner(min_resource=1, reduction_factor=3, margin=margin))
    seen = []
    for value in (0.40, 0.38, 0.30):
        trial = study.ask()
        trial.report(value, step=1)
        seen.append(trial.should_prune())
        study.tell(trial, value)
    assert seen == pruned


def test_noise_aware_halving_refuses_a_negative_margin() -> None:
    from proftune.search._pruners import NoiseAwareHalvingPruner

    with pytest.raises(ConfigError, match="margin"):
        NoiseAwareHalvingPruner(margin=-0.1)
