from __future__ import annotations

from typing import ClassVar

import pytest

from proftune import ConfigError, noise_scale

from ._tasks import LinearRegressionTask


@pytest.mark.parametrize("seed", [0, 1])
def test_noise_scale_within_20_percent_of_the_closed_form(seed: int) -> None:
    # d = 16, |δ|² = 1, σ² = 1: tr(Σ) = d(|δ|² + σ²) + |δ|² = 33, |G|² = 1, B_simple = 33
    task = LinearRegressionTask()
    truth_b, truth_trace = task.true_b_simple(), task.true_trace_sigma()
    assert truth_b == pytest.approx(33.0)
    assert truth_trace == pytest.approx(33.0)
    r = noise_scale(task, small_batch=4, micro_batches=8, steps=250, ema=0.99, device="cpu", seed=seed)
    assert r.small_batch == 4
    assert r.big_batch == 32
    assert r.used_steps == 250
    assert r.b_simple == pytest.approx(truth_b, rel=0.2)
    assert r.trace_sigma == pytest.approx(truth_trace, rel=0.2)
    assert r.grad_sq_norm == pytest.approx(task.delta_sq, rel=0.2)
    assert r.critical_batch_size == round(r.b_simple)
    assert r.clipped_steps == 0
    assert len(r.history) == 250


class _AtOptimum(LinearRegressionTask):
    """δ = 0: the true gradient is zero, so every |G|² estimate is pure noise around 0."""

    delta_sq: ClassVar[float] = 1e-30


def test_negative_gradient_norm_estimates_are_clipped() -> None:
    r = noise_scale(_AtOptimum(), small_batch=4, micro_batches=4, steps=60, ema=0.9, device="cpu")
    assert r.clipped_steps > 0
    # clipped to 1% of |G_B|²: B_simple stays finite, below 100x the big batch
    assert r.b_simple is not None
    assert 0 < r.b_simple <= 100 * r.big_batch
    assert any(row["grad_sq_norm"] < 0 for row in r.history)


def test_noise_scale_on_a_real_task_is_positive_and_partial_groups_are_skipped() -> None:
    r = noise_scale("digits-mlp", small_batch=16, micro_batches=4, steps=25, device="cpu")
    # 1437 samples in batches of 16 give 90 batches: groups of 4 leave a partial group of 2
    assert 0 < r.used_steps <= 25
    assert r.b_simple is not None
    assert r.b_simple > 0
    assert all(row["g_small_sq"] >= row["g_big_sq"] * 0.5 for row in r.history)


def test_noise_scale_arguments_are_validated_together() -> None:
    with pytest.raises(ConfigError) as info:
        noise_scale("digits-mlp", small_batch=0, micro_batches=1, steps=0, ema=1.5)
    assert len(info.value.problems) == 4
