"""A computed batch is checked against what an epoch costs at it (issue 60): a batch whose epoch
costs more than twice the defaults' is moved toward the defaults' batch, with the times in its
reason; and none leaves an epoch fewer than 8 optimizer steps (900 samples: at most 112)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import proftune
from proftune.recommend import _api
from proftune.recommend._batch_cost import MAX_EPOCH_COST, bound_by_cost, step_timer
from proftune.recommend._noise_scale import NoiseScaleResult

from .test_checked_values import PlateauMLP


def _timer(fixed_ms: float, per_sample_ms: float, *, wobble: float = 0.0, seed: int = 0) -> Any:
    """A step time of ``fixed + per_sample * batch`` ms, each call off by up to ``wobble`` (a share)."""
    gen = torch.Generator().manual_seed(seed)
    calls: list[int] = []

    def measure(batch: int) -> float:
        calls.append(batch)
        noise = 1.0 + wobble * (2.0 * float(torch.rand(1, generator=gen)) - 1.0)
        return (fixed_ms + per_sample_ms * batch) * noise

    measure.calls = calls  # type: ignore[attr-defined]
    return measure


def test_a_tiny_batch_whose_epoch_costs_too_much_moves_toward_the_defaults() -> None:
    # 1 ms a step whatever the batch, 0.03 ms a sample: 900 samples at batch 2 are 450 steps,
    # 8.5x the defaults' epoch at 32 (29 steps); at 8, 2.5x; at 16, 57 steps: 1.5x
    for seed in range(3):
        cost = bound_by_cost(2, default_batch=32, samples=900, timer=_timer(1.0, 0.03, wobble=0.1, seed=seed))
        assert cost is not None
        assert cost.moved
        assert cost.batch == 16, cost.describe()
        assert [c.batch for c in cost.checks] == [2, 4, 8, 16]
        assert cost.checks[0].epoch_ratio > 6
        assert cost.checks[-1].epoch_ratio <= MAX_EPOCH_COST
        assert "batch 2 costs more than 2x the defaults' epoch, so batch 16" in cost.describe()


def test_a_batch_whose_epoch_costs_little_is_kept() -> None:
    # per-sample cost dominates: an epoch costs the same at any batch
    cost = bound_by_cost(4, default_batch=32, samples=900, timer=_timer(0.01, 0.1))
    assert cost is not None
    assert not cost.moved
    assert cost.batch == 4
    assert bound_by_cost(32, default_batch=32, samples=900, timer=_timer(1.0, 0.0)) is None


def test_a_ratio_the_bound_already_decides_takes_one_round_and_a_close_one_all() -> None:
    # an epoch at batch 4 costs the same as the defaults' (per-sample cost): 1x, far under 2x: one
    # round of two timings; at 1 ms a step and 0.03 ms a sample, batch 8 costs 2.5x: near the
    # bound, every round (the fastest of three of each batch)
    clear = _timer(0.01, 0.1)
    assert not bound_by_cost(4, default_batch=32, samples=900, timer=clear).moved  # type: ignore[union-attr]
    assert sorted(clear.calls) == [4, 32]
    close = _timer(1.0, 0.03)
    cost = bound_by_cost(8, default_batch=32, samples=900, timer=close)
    assert cost is not None
    assert cost.batch == 16
    assert close.calls.count(8) == 3
    assert close.calls.count(32) >= 3


def test_a_larger_batch_whose_epoch_costs_more_moves_down() -> None:
    # a step that grows faster than its batch (memory thrash): batch 112 costs ~4x the defaults' epoch
    def convex(batch: int) -> float:
        return 0.1 * batch + 0.004 * batch**2

    cost = bound_by_cost(112, default_batch=16, samples=900, timer=convex)
    assert cost is not None
    assert cost.moved
    assert 16 <= cost.batch < 112
    assert cost.checks[-1].epoch_ratio <= MAX_EPOCH_COST or cost.batch == 16


def test_the_step_timer_times_the_tasks_own_steps() -> None:
    task = PlateauMLP()
    timer = step_timer(task, proftune.TrainParams.of(task), device=torch.device("cpu"), seed=0)
    ms = timer(8)
    assert 0 < ms < 1000


class _SlowSchedule(PlateauMLP):
    """PlateauMLP whose schedule takes 5 ms a step: a cost every step pays, outside its phases."""

    def configure_scheduler(self, optimizer: torch.optim.Optimizer, params: dict[str, Any], *,
                            epochs: int | None, max_steps: int | None) -> Any:
        import time

        def factor(_: int) -> float:
            time.sleep(0.005)
            return 1.0

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def test_the_step_timer_times_what_an_epoch_pays_for_a_step_not_its_phases_alone() -> None:
    # the phases (data, forward, backward, optimizer) of this tiny MLP take well under a millisecond;
    # an epoch pays the schedule's 5 ms at every step too
    task = _SlowSchedule()
    timer = step_timer(task, proftune.TrainParams.of(task), device=torch.device("cpu"), seed=0)
    assert timer(8) >= 5.0


class _NormMLP(PlateauMLP):
    """A BatchNorm MLP: it cannot train at batch 1."""

    def build_model(self, params: dict[str, Any]) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 4))


def test_a_batch_the_task_cannot_train_at_moves_toward_the_defaults() -> None:
    task = _NormMLP()
    timer = step_timer(task, proftune.TrainParams.of(task), device=torch.device("cpu"), seed=0)
    assert timer(1) == float("inf")
    cost = bound_by_cost(1, default_batch=16, samples=400, timer=timer)
    assert cost is not None
    assert cost.batch > 1
    assert cost.checks[0].epoch_ratio == float("inf")


def _small_noise_scale(*_: Any, **__: Any) -> NoiseScaleResult:
    """A noise scale measured where the loss fell steeply, whose B_simple is 2 (a plateau's first fall)."""
    losses = tuple(3.6 - 0.05 * i for i in range(30))
    return NoiseScaleResult(b_simple=2.0, trace_sigma=2.0, grad_sq_norm=1.0, small_batch=4, big_batch=16,
                            steps=30, used_steps=30, clipped_steps=0, ema=0.9, history=(), losses=losses)


def _high_noise_scale(*_: Any, **__: Any) -> NoiseScaleResult:
    losses = tuple(1.4 - 0.01 * i for i in range(30))
    return NoiseScaleResult(b_simple=3200.0, trace_sigma=3200.0, grad_sq_norm=1.0, small_batch=4, big_batch=16,
                            steps=30, used_steps=30, clipped_steps=0, ema=0.9, history=(), losses=losses)


def _recommend(task: proftune.Task) -> proftune.Recommendations:
    return proftune.recommend(task, device="cpu", lr_steps=10, ladder_steps=0, noise_steps=12,
                              optimizer_budget_s=0, embedding_budget_s=0, precision_check=False)


def test_recommend_does_not_give_a_batch_whose_epoch_costs_more_than_twice_the_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 400 samples of a tiny MLP: a step costs its overhead at any small batch, so batch 2 (200 steps
    # an epoch) costs ~8x the defaults' epoch at 16 (25 steps)
    monkeypatch.setattr(_api, "noise_scale", _small_noise_scale)
    row = _recommend(PlateauMLP()).get("batch_size")
    assert row.value >= 4, row.reason
    cost = row.evidence["epoch_cost"]
    assert cost["computed"] == 2
    assert cost["checks"][0]["epoch_ratio"] > MAX_EPOCH_COST
    assert "costs more than 2x the defaults' epoch" in row.reason


def test_recommend_leaves_an_epoch_at_least_8_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_api, "noise_scale", _high_noise_scale)
    row = _recommend(PlateauMLP()).get("batch_size")
    assert row.value <= 400 // 8, row.reason
    assert "bounded by the data" in row.reason


def test_the_noise_probe_of_a_batch_norm_model_at_batch_2_trains_on_two_samples_at_least(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults at batch 2: the probe's micro-batches were a quarter of it, one sample, which a
    batch-norm layer cannot train on (recommend crashed in optimize's compute stage)."""
    seen: list[int] = []
    real = _api.noise_scale

    def spy(*args: Any, small_batch: int, **kw: Any) -> NoiseScaleResult:
        seen.append(small_batch)
        return real(*args, small_batch=small_batch, **kw)

    monkeypatch.setattr(_api, "noise_scale", spy)
    task = _NormMLP()
    task.default_params = {**task.default_params, "batch_size": 2}  # type: ignore[misc]
    assert _recommend(task).get("batch_size") is not None
    assert seen == [2]
