"""A NaN that comes after a fixed number of calls, whatever the rate, is not blamed on the
learning rate (issue 47: "lower it to 3.33e-07"): the steps up to it are run again at a hundredth
of the rate, and the finding says what that measured."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

import proftune
from proftune.examples._digits import DigitsMLP

from .broken_tasks import SGD


class _NaNFromCall(DigitsMLP):
    """The loss is NaN from its 40th call on, whatever the weights (a counter in the task)."""

    name = "digits-nan-from-call-40"
    default_params: ClassVar[dict[str, Any]] = dict(SGD)

    def __init__(self) -> None:
        self.calls = 0

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        self.calls += 1
        out = super().loss(model, batch)
        return out * float("nan") if self.calls >= 40 else out


class _Explodes(DigitsMLP):
    """SGD at a rate so high that the loss overflows within a few steps (at a hundredth of it,
    the loss stays finite for the epoch)."""

    name = "digits-overflow"
    default_params: ClassVar[dict[str, Any]] = {**SGD, "lr": 1e5}


def test_a_nan_at_a_fixed_call_is_not_blamed_on_the_learning_rate() -> None:
    result = proftune.diagnose(_NaNFromCall(), epochs=3, record=False)
    top = result.top
    assert top is not None
    assert top.cause == "nan_inf"
    assert top.root
    assert "lr_too_high" not in {f.cause for f in result.findings}
    probe = top.evidence["nan_probe"]
    assert probe["follows_lr"] is False
    assert probe["probe_lr"] == SGD["lr"] * 0.01
    assert probe["probe_nan_step"] is not None
    assert probe["probe_nan_step"] <= top.step
    assert "not the learning rate" in top.summary
    assert "0.001" in top.summary
    assert "(the loss made it)" in top.summary  # weights, inputs and layer outputs finite
    assert "will not help" in top.fix
    assert "lower the learning rate to" not in top.fix
    assert result.lr_test is None  # no range test is asked where the rate is not the cause


def test_a_nan_the_rate_drives_still_points_at_the_rate() -> None:
    result = proftune.diagnose(_Explodes(), epochs=1, record=False, lr_test=False)
    nan = next(f for f in [*result.findings, *(c for f in result.findings for c in f.consequences)]
               if f.cause == "nan_inf")
    assert nan.evidence["nan_probe"]["follows_lr"] is True
    assert "the NaN follows the rate" in nan.summary
