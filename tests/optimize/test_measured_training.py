"""The race's reserve during the search plans its trainings as the trials took them (issue 60: on
a task whose training takes 0.06 s, the plan's 0.3 s of fixed cost a run made the reserve 5x what
the race's rounds took, and the search stopped after 0.7 s of its 6.6 s with 9 trials)."""

from __future__ import annotations

import pytest

from proftune.optimize._search import measured_training_s
from proftune.search import TrialRecord


def _trial(n: int, *, seconds: float, epochs: int, state: str = "complete") -> TrialRecord:
    return TrialRecord(number=n, state=state, params={"lr": 0.01}, values=[0.5] if state == "complete" else None,
                       metrics={}, constraints={}, reason=None, duration_s=seconds,
                       curve=[{"epoch": e + 1} for e in range(epochs)])


def test_a_training_is_planned_as_three_whole_trials_took_it() -> None:
    rows = [_trial(i, seconds=s, epochs=2) for i, s in enumerate((0.04, 0.05, 0.07))]
    assert measured_training_s(rows, 2, planned=0.34) == pytest.approx(1.25 * 0.05)
    # fewer than three whole trials: as planned
    assert measured_training_s(rows[:2], 2, planned=0.34) == 0.34
    # trials cut short (pruned, or fewer epochs) time no whole training
    short = [_trial(i, seconds=0.01, epochs=1) for i in range(5)] + [_trial(9, seconds=0.01, epochs=2, state="pruned")]
    assert measured_training_s(short, 2, planned=0.34) == 0.34
    # never above the plan: a slow trial under load does not grow the race's reserve
    slow = [_trial(i, seconds=2.0, epochs=2) for i in range(4)]
    assert measured_training_s(slow, 2, planned=0.34) == 0.34
