"""Hinton distillation as a Task wrapper trained by the one fit loop."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from proftune import fit
from proftune.compress import DistillationTask, hinton_loss
from proftune.exceptions import ConfigError
from proftune.task import load_task


def test_hinton_loss_is_zero_for_equal_logits_and_scales_with_t_squared() -> None:
    s = torch.randn(8, 10)
    assert float(hinton_loss(s, s, 4.0)) == pytest.approx(0.0, abs=1e-6)
    t = torch.randn(8, 10)
    kl = F.kl_div(F.log_softmax(s / 2, -1), F.softmax(t / 2, -1), reduction="batchmean")
    assert float(hinton_loss(s, t, 2.0)) == pytest.approx(4 * float(kl), rel=1e-5)


def test_distillation_loss_mixes_kd_and_task_loss_and_trains_with_fit() -> None:
    task = load_task("digits-mlp")
    torch.manual_seed(0)
    teacher, student = task.build_model({"hidden": 32}), task.build_model({"hidden": 16})
    wrapped = DistillationTask(task, teacher, temperature=3.0, alpha=0.7)
    x, y = next(iter(task.train_data(16, {})))
    with torch.no_grad():
        expected = 0.7 * hinton_loss(student(x), teacher(x), 3.0) + 0.3 * F.cross_entropy(student(x), y)
        assert float(wrapped.loss(student, (x, y))) == pytest.approx(float(expected), rel=1e-5)
    result = fit(wrapped, {"hidden": 16}, model=student, max_steps=3, device="cpu", evaluate=True)
    assert "accuracy" in result.metrics
    assert result.steps == 3
    assert not any(p.requires_grad for p in teacher.parameters())


def test_bad_temperature_and_alpha_are_listed_together() -> None:
    task = load_task("digits-mlp")
    with pytest.raises(ConfigError) as err:
        DistillationTask(task, task.build_model({}), temperature=0.0, alpha=1.5)
    assert len(err.value.problems) == 2
