"""A computed batch is a hypothesis timed on the task before the search centres on it (issue 60): at
least eight steps an epoch, and an epoch at most twice the defaults'; otherwise the centre is the
nearest batch towards the defaults' that does both, its rate rescaled by the rule that scaled it."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pytest
import torch

from proftune.optimize._batch_check import TIMED_STEPS, check_computed_batch, checked_batch
from proftune.optimize._computed import BatchCheck, ComputedValues
from proftune.optimize._records import ComputeOutputs
from proftune.recommend import Recommendation, Recommendations
from proftune.train import fit

from .tasks import TinyTask

SAMPLES = 192
WAIT_S = 0.01


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # the optimize loop's baseline has measured the thread count by the time the check runs; here
    # nothing has, and measuring it takes longer than the check
    monkeypatch.setenv("PROFTUNE_THREADS", "1")


class FixedStepCost(TinyTask):
    """TinyTask whose every batch waits 10 ms, whatever its size: a step's fixed cost dominates, as on
    a small model on a CPU."""

    name = "tiny-fixed-step-cost"

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        for batch in super().train_data(batch_size, params):
            time.sleep(WAIT_S)
            yield batch


def _default_epoch_s(task: TinyTask) -> float:
    """The defaults' epoch, timed as the baseline's no-tricks run times it."""
    res = fit(task, dict(task.default_params), max_steps=TIMED_STEPS, device="cpu", seed=0, evaluate=False)
    return res.duration_s / res.steps * (SAMPLES / int(task.default_params["batch_size"]))


def _check(batch: int, rule: str | None = "sqrt") -> BatchCheck:
    task = FixedStepCost()
    check = check_computed_batch(task, dict(task.default_params), batch, samples=SAMPLES,
                                 default_epoch_s=_default_epoch_s(task), lr_scaling=rule,
                                 device=torch.device("cpu"), seed=0)
    assert check is not None
    return check


def test_a_tiny_computed_batch_that_costs_many_times_the_defaults_epoch_moves_towards_the_defaults() -> None:
    check = _check(2)  # 96 steps of >= 10 ms against the defaults' 6
    assert check.epoch_s is not None
    assert check.default_epoch_s is not None
    assert check.epoch_s > 2 * check.default_epoch_s, check
    assert check.moved
    # the nearest batch (doubling from 2) whose epoch is within twice the defaults': 16 (12 steps vs 6)
    # on a quiet machine; the fit loop's own cost per step, larger under load, can push it to the defaults'
    assert check.batch in (16, 32), check.describe()
    assert check.lr_factor == pytest.approx((check.batch / 2) ** 0.5)
    assert "is not the search's centre" in check.describe()
    assert "more than 2x the defaults'" in check.describe()


def test_a_computed_batch_that_leaves_too_few_steps_an_epoch_moves_to_eight_steps() -> None:
    check = _check(64, rule="linear")  # 3 steps an epoch of 192 samples
    assert check.moved
    assert check.batch == SAMPLES // 8
    assert check.lr_factor == pytest.approx(24 / 64)
    assert "fewer than 8" in check.describe()


def test_an_affordable_computed_batch_is_the_centre_and_the_defaults_batch_is_not_checked() -> None:
    check = _check(24)  # 8 steps of ~10 ms against 6
    assert not check.moved, check.describe()
    assert check.lr_factor == 1.0
    assert "is the search's centre" in check.describe()
    task = FixedStepCost()
    assert check_computed_batch(task, dict(task.default_params), 32, samples=SAMPLES, default_epoch_s=0.1,
                                lr_scaling=None, device=torch.device("cpu"), seed=0) is None


def test_the_stage_hands_the_search_the_moved_batch_and_its_rescaled_rate_and_records_why() -> None:
    task = FixedStepCost()
    recs = Recommendations(items=(Recommendation("lr_scaling", "sqrt", "why"),))
    computed, check = checked_batch(task, dict(task.default_params), ComputedValues(batch_size=2, lr=0.01), recs,
                                    samples=SAMPLES, default_epoch_s=_default_epoch_s(task),
                                    device=torch.device("cpu"), seed=0)
    assert check is not None
    assert check.moved
    assert computed.batch_size == check.batch
    assert check.batch in (16, 32)
    assert computed.lr == pytest.approx(0.01 * (check.batch / 2) ** 0.5)
    out = ComputeOutputs(computed=computed, batch_check=check)
    assert ComputeOutputs.from_dict(out.to_dict()).batch_check == check
    assert "batch_check" not in ComputeOutputs(computed=computed).to_dict()  # nothing where nothing was checked
