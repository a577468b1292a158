"""lr-find suggests no rate from a loss that only came back to chance level (issue 60: a plateau-
start CNN's loss from 3.64 back to 2.30 = ln 10 read as learning, and 0.0316 suggested)."""

from __future__ import annotations

import math

import numpy as np

from proftune import TrainParams
from proftune.recommend._lr_find import chance_loss, suggest_lr
from proftune.recommend._lr_ladder import LadderRung, read_ladder

from ._tasks import LinearRegressionTask
from .test_checked_values import PlateauMLP, _data

LN10 = math.log(10.0)


def _back_to_chance(n: int = 100, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A sweep whose loss starts above chance (3.64: confidently wrong), falls to ln 10 and stays
    there until it blows up: it learns the labels' frequencies, nothing of the inputs."""
    rng = np.random.default_rng(seed)
    lrs = np.geomspace(1e-7, 10.0, n)
    t = np.linspace(0.0, 1.0, n)
    loss = LN10 + (3.64 - LN10) * np.exp(-t / 0.15)
    loss[int(0.85 * n):] += np.linspace(0.0, 20.0, n - int(0.85 * n))
    return lrs, loss + rng.normal(0.0, 0.01, n)


def test_no_rate_is_read_off_a_loss_that_only_came_back_to_chance() -> None:
    lrs, losses = _back_to_chance()
    assert suggest_lr(lrs, losses).suggested_lr is not None  # without the chance level: read as a fall
    reading = suggest_lr(lrs, losses, chance=LN10)
    assert reading.suggested_lr is None
    assert reading.message is not None
    assert "chance level" in reading.message


def test_a_loss_that_falls_below_chance_still_gives_a_rate() -> None:
    lrs, losses = _back_to_chance()
    learned = losses.copy()
    learned[30:85] -= np.linspace(0.0, 1.5, 55)  # below ln 10: the inputs were learned
    assert suggest_lr(lrs, learned, chance=LN10).suggested_lr is not None


def test_the_chance_loss_is_the_entropy_of_the_training_labels() -> None:
    task = PlateauMLP()
    _, y = _data()
    p = np.bincount(y.numpy(), minlength=4) / len(y)
    expected = float(-(p * np.log(p)).sum())
    got = chance_loss(task, TrainParams.of(task), 16)
    assert got is not None
    assert abs(got - expected) < 1e-9
    assert abs(got - math.log(4)) < 0.05
    regression = LinearRegressionTask()
    assert chance_loss(regression, TrainParams.of(regression), 8) is None  # a regression: no constant class to predict


def test_a_ladder_whose_rates_fell_only_to_chance_decides_nothing() -> None:
    rungs = [LadderRung(lr=lr, steps=40, start_loss=3.64, end_loss=LN10 + 0.001, noise=0.002, diverged=False)
             for lr in (1e-3, 3e-3, 1e-2)]
    assert read_ladder(rungs).best_lr is not None  # without the chance level: each "fell"
    reading = read_ladder(rungs, chance=LN10)
    assert reading.best_lr is None
    assert "chance level" in reading.message
    learned = [*rungs, LadderRung(lr=3e-2, steps=40, start_loss=3.64, end_loss=1.2, noise=0.01, diverged=False)]
    assert read_ladder(learned, chance=LN10).best_lr == 3e-2
