"""A computed lr is a hypothesis checked on the task before the search centres on it (issue 60):
its short run against the defaults' at the same wall clock; where it does not win, the centre
stays the defaults' lr and the output says so."""

from __future__ import annotations

import torch

from proftune.optimize._computed import ComputedValues, LrCheck
from proftune.optimize._lr_check import check_computed_lr, short_check_seconds
from proftune.optimize._records import ComputeOutputs
from proftune.optimize._search_plan import build_plan

from .tasks import TooSlowLR


def _check(lr: float) -> LrCheck:
    task = TooSlowLR()
    check = check_computed_lr(task, dict(task.default_params), ComputedValues(lr=lr, batch_size=32),
                              metric="accuracy", maximize=True, seconds=0.5, device=torch.device("cpu"), seed=0,
                              val_samples=96)
    assert check is not None
    return check


def test_a_computed_lr_that_trains_where_the_defaults_barely_move_is_the_centre() -> None:
    check = _check(1e-2)
    assert check.used, check.describe()
    assert check.computed_value is not None
    assert check.defaults_value is not None
    assert check.computed_value > check.defaults_value + check.margin
    assert "the search centres on the computed lr" in check.describe()


def test_a_computed_lr_that_does_no_better_than_the_defaults_is_not_the_centre() -> None:
    # a rate that trains no better than the defaults' own (here: 100x below it)
    check = _check(1e-7)
    assert not check.used, check.describe()
    assert "centres on the defaults' lr" in check.describe()
    # the stage then hands the search no computed lr: its centre is the task's own
    task = TooSlowLR()
    plan = build_plan(task, ComputedValues(batch_size=32), user_space=None, max_batch=None, samples=192)
    assert plan.centre["lr"] == task.default_params["lr"]
    out = ComputeOutputs(computed=ComputedValues(batch_size=32), lr_check=check)
    back = ComputeOutputs.from_dict(out.to_dict())
    assert back.lr_check == check


def test_nothing_to_check_without_a_computed_lr_or_at_the_defaults_own() -> None:
    task = TooSlowLR()
    for lr in (None, 1e-5):
        assert check_computed_lr(task, dict(task.default_params), ComputedValues(lr=lr), metric="accuracy",
                                 maximize=True, seconds=0.5, device=torch.device("cpu"), seed=0,
                                 val_samples=96) is None
    assert short_check_seconds(9.0) < short_check_seconds(60.0) <= 3.0
