from __future__ import annotations

import math

import pytest
import torch

from proftune import ConfigError
from proftune.recommend import StepCost, optimizer_family, plan_accumulation, scale_lr


def test_sgd_scales_linearly_and_adam_by_square_root() -> None:
    sgd = scale_lr(0.1, from_batch=64, to_batch=256, optimizer="sgd")
    adam = scale_lr(1e-3, from_batch=64, to_batch=256, optimizer="adamw")
    assert sgd.rule == "linear"
    assert sgd.lr == pytest.approx(0.4)
    assert adam.rule == "sqrt"
    assert adam.lr == pytest.approx(2e-3)
    assert "Goyal" in sgd.reason
    assert "Malladi" in adam.reason


def test_scaling_down_and_from_optimizer_instances() -> None:
    p = [torch.nn.Parameter(torch.zeros(1))]
    assert optimizer_family(torch.optim.SGD(p, lr=0.1, momentum=0.9)) == ("SGD", "linear")
    assert optimizer_family(torch.optim.Adam(p)) == ("Adam", "sqrt")
    assert optimizer_family(torch.optim.RMSprop) == ("RMSprop", "sqrt")
    down = scale_lr(1e-3, from_batch=256, to_batch=64, optimizer="adam")
    assert down.lr == pytest.approx(5e-4)


def test_scaling_stops_at_the_critical_batch() -> None:
    rule = scale_lr(0.1, from_batch=32, to_batch=1024, optimizer="sgd", critical_batch=128)
    assert rule.capped_at == 128
    assert rule.lr == pytest.approx(0.4)
    assert "critical batch size 128" in rule.reason


def test_unknown_optimizer_and_bad_lr_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="optimizer='lbfgs'"):
        scale_lr(0.1, from_batch=1, to_batch=2, optimizer="lbfgs")
    with pytest.raises(ConfigError, match="lr="):
        scale_lr(-1.0, from_batch=1, to_batch=2)


def test_accumulation_reaches_the_target_with_fewest_micro_batches() -> None:
    plan = plan_accumulation(1000, 300)
    assert plan.steps == 4
    assert plan.micro_batch == 250
    assert plan.effective_batch == 1000
    assert plan.micro_batch <= 300
    fits = plan_accumulation(128, 512)
    assert fits.steps == 1
    assert fits.micro_batch == 128
    odd = plan_accumulation(1001, 300)
    assert odd.steps == 4
    assert odd.effective_batch >= 1001
    assert odd.micro_batch <= 300


def test_accumulation_time_from_the_measured_step() -> None:
    # 10 ms of data+forward+backward at batch 100, 2 ms of optimizer step
    cost = StepCost(batch_size=100, per_batch_ms=10.0, fixed_ms=2.0)
    plan = plan_accumulation(800, 200, cost=cost)
    assert plan.steps == 4
    assert plan.micro_batch == 200
    assert plan.step_ms == pytest.approx(4 * 20.0 + 2.0)
    assert plan.samples_per_s == pytest.approx(800 / 82.0 * 1e3)
    assert plan.single_step_ms == pytest.approx(80.0 + 2.0)
    assert "82.0 ms" in plan.reason
    assert math.isfinite(plan.step_ms)
