"""The helpers that live in one place: global grad norm, the synchronized clock, JSON cleaning."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from proftune._device import clock
from proftune._jsonsafe import finite_float, is_finite_number, json_dumps, json_safe
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


def _strict(text: str) -> object:
    """Parse as RFC 8259 JSON: a NaN or Infinity token raises."""
    def refuse(token: str) -> object:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_json_dumps_writes_strict_json() -> None:
    value = {"loss": float("nan"), "rate": [float("inf"), 2.0], "t": (1, 2), "obj": object()}
    text = json_dumps(value, indent=1, sort_keys=True)
    assert _strict(text) == {"loss": None, "obj": str(value["obj"]), "rate": [None, 2.0], "t": [1, 2]}
    with pytest.raises(ValueError, match="NaN"):
        _strict(json.dumps({"loss": float("nan")}))  # what a bare json.dumps writes


@pytest.mark.parametrize(("value", "expected"), [
    (1, 1.0), (0.5, 0.5), (np.float32(0.25), 0.25), (torch.tensor(3.0), 3.0),
    (float("nan"), None), (float("inf"), None), (-float("inf"), None), (None, None), (True, None),
    ("1.5", None), (torch.ones(2), None), (object(), None)])
def test_finite_float_is_the_one_finite_number_check(value: object, expected: float | None) -> None:
    assert finite_float(value) == expected
    assert is_finite_number(value) is (expected is not None)


def test_every_json_writer_goes_through_json_dumps() -> None:
    """No module writes JSON on its own (``json.dump(s)`` allows NaN; ``default=str`` hides types),
    and the finite-number check is not written again under a private name."""
    src = Path(__file__).resolve().parents[1] / "src" / "proftune"
    own = src / "_jsonsafe.py"
    offenders = []
    for path in sorted(src.rglob("*.py")):
        if path == own:
            continue
        text = path.read_text()
        for m in re.finditer(r"json\.dumps?\([^\n]*|default=str|def _finite\(|not isinstance\(\w+, bool\) and "
                             r"math\.isfinite", text):
            if "allow_nan=False" in m.group(0):  # a strict check (the Store's fast path), not a writer
                continue
            offenders.append(f"{path.relative_to(src)}:{text[:m.start()].count(chr(10)) + 1}: {m.group(0)}")
    assert not offenders, offenders
