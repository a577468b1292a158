"""The helpers that live in one place: global grad norm, the synchronized clock, JSON cleaning."""

from __future__ import annotations

import json
import math

import pytest
import torch

from proftune._device import clock
from proftune._jsonsafe import json_safe
from proftune._tensors import global_grad_norm, l2_norm


def test_global_grad_norm_matches_clipping() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model(torch.randn(5, 4)).pow(2).sum().backward()
    expected = float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
    assert global_grad_norm(model) == pytest.approx(expected, rel=1e-6)
    assert l2_norm([torch.tensor([3.0]), torch.tensor([4.0])]) == pytest.approx(5.0)
    assert global_grad_norm(torch.nn.Linear(2, 2)) == 0.0  # no gradients yet
    model[0].weight.grad[0, 0] = float("nan")  # type: ignore[index]
    assert math.isnan(global_grad_norm(model))


def test_clock_is_monotonic_seconds() -> None:
    a = clock(torch.device("cpu"))
    b = clock(None)
    assert b >= a


def test_json_safe_one_nan_policy() -> None:
    class Rec:
        def to_dict(self) -> dict[str, object]:
            return {"loss": float("nan")}

    value = {"a": (1.0, float("inf"), -float("inf")), 2: torch.tensor(0.5), "r": Rec(), "o": object}
    out = json_safe(value)
    assert out["a"] == [1.0, None, None]
    assert out["2"] == 0.5
    assert out["r"] == {"loss": None}
    json.dumps(out, allow_nan=False)  # strict JSON
