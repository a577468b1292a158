"""A computed lr is a hypothesis checked on the task before the search centres on it (issue 60):
its short run against the defaults' at the same wall clock; where it does not win, the centre
stays the defaults' lr and the output says so."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from proftune._train_params import TrainParams
from proftune.optimize._computed import ComputedValues, LrCheck
from proftune.optimize._lr_check import check_computed_lr, short_check_seconds
from proftune.optimize._records import ComputeOutputs
from proftune.optimize._search_plan import build_plan

from .tasks import TinyTask, TooSlowLR


def _check(lr: float) -> LrCheck:
    task = TooSlowLR()
    check = check_computed_lr(task, TrainParams.of(task), ComputedValues(lr=lr, batch_size=32),
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
        assert check_computed_lr(task, TrainParams.of(task), ComputedValues(lr=lr), metric="accuracy",
                                 maximize=True, seconds=0.5, device=torch.device("cpu"), seed=0,
                                 val_samples=96) is None
    assert short_check_seconds(9.0) < short_check_seconds(60.0) <= 3.0


def test_the_profile_and_the_compute_stage_are_sized_to_their_shares() -> None:
    from proftune.optimize._stage_measures import COMPUTE_MIN_STEPS, profile_steps, too_few_steps

    step = 0.05
    # the full profile runs each measured step twice beside four others: 1 step where 6 fit, 3 where 10 do
    assert [profile_steps(n * step, step) for n in (1, 6, 8, 9, 10, 100)] == [1, 1, 2, 2, 3, 3]
    assert too_few_steps(COMPUTE_MIN_STEPS * step * 1.01, step) is None
    why = too_few_steps(10 * step, step)
    assert why is not None
    assert "holds 10 training steps of 50 ms" in why
    assert f"fewer than the {COMPUTE_MIN_STEPS}" in why


def test_a_compute_share_too_small_for_a_range_test_measures_nothing_and_says_why(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from proftune.optimize._builtin import Compute
    from proftune.optimize._stage_measures import steps_per_epoch
    from proftune.profile import profile

    task = TinyTask()
    defaults = dict(task.default_params)
    profile(task, params=defaults, steps=1).save(tmp_path / "profile.json")
    step_s = 1.0 / steps_per_epoch(task, TrainParams.of(task))  # an epoch of 1 s: far longer than the profile's step
    loop = SimpleNamespace(out=tmp_path, task=task, defaults=defaults, defaults_record=TrainParams.of(task),
                           planner=SimpleNamespace(epoch_s=lambda: 1.0))
    started = time.monotonic()
    result = Compute().run(loop, 5 * step_s, started + 5 * step_s)  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0  # nothing trained
    assert result.status == "skipped"
    assert result.outputs.computed.params() == {}
    assert "holds 5 training steps" in (result.outputs.not_measured or "")
    assert "not_measured" in result.outputs.to_dict()


def test_the_defaults_side_is_read_off_their_own_training_where_whole_epochs_fit(monkeypatch) -> None:
    """The baseline trained the defaults from the same seed and scored each epoch: the check reads
    their figure after the whole epochs its seconds hold, trains only the computed rate (for those
    epochs' seconds), and reaches the verdicts the two short runs reach."""
    from proftune.optimize import _lr_check
    from proftune.optimize._lr_check import from_curve
    from proftune.optimize._stage_measures import ModelCapture, steps_per_epoch
    from proftune.train import fit

    task = TooSlowLR()
    defaults = TrainParams.of(task)
    capture = ModelCapture("accuracy")
    started = time.perf_counter()
    res = fit(task, defaults, seed=0, device="cpu", callbacks=[capture])
    epoch_s = (time.perf_counter() - started) / res.epochs
    assert len(capture.curve) == res.epochs >= 2
    assert from_curve(capture.curve, epoch_s, 0.5 * epoch_s) is None  # an epoch longer than the check
    assert from_curve(capture.curve, None, 1.0) is None
    assert from_curve(capture.curve, epoch_s, 2.5 * epoch_s) == (2, capture.curve[1])
    assert from_curve(capture.curve, epoch_s, 100 * epoch_s) == (len(capture.curve), capture.curve[-1])
    trained: list[float] = []
    real = _lr_check.fit

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        trained.append(float(args[1].lr))
        return real(*args, **kwargs)

    monkeypatch.setattr(_lr_check, "fit", counted)
    for lr, used in ((1e-2, True), (1e-7, False)):
        trained.clear()
        check = check_computed_lr(task, defaults, ComputedValues(lr=lr, batch_size=32), metric="accuracy",
                                  maximize=True, seconds=2.5 * epoch_s, device=torch.device("cpu"), seed=0,
                                  val_samples=96, defaults_curve=capture.curve, epoch_s=epoch_s,
                                  epoch_steps=steps_per_epoch(task, defaults))
        assert check is not None
        assert trained == [lr]  # the computed rate only
        assert check.defaults_epochs == 2
        assert check.defaults_value == capture.curve[1]
        assert check.defaults_steps == 2 * steps_per_epoch(task, defaults)
        assert check.seconds == 2 * epoch_s
        assert check.used is used, check.describe()
        assert "their own training after 2 epoch(s)" in check.describe()
        assert LrCheck.from_dict(check.to_dict()) == check
