"""Profiling's bookkeeping grows linearly with the number of layers, never quadratically.

Counted, not timed: the lines of proftune's own code that run while profiling MLPs of n, 2n and
4n layers. Linear code costs the same per added layer, so the count's increments are in ratio
exactly 2; one loop over the layers seen so far, run at each layer call, pushes it to 2.08 at
these sizes (checked by planting one in ``LayerTimer._on_leaf``). Work hidden inside one line
(``name in a_list``) is caught by counting the hashes and comparisons of the layer names in the
per-layer summary at two sizes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from torch import nn

import proftune
from proftune.profile import _timing

PACKAGE = str(Path(proftune.__file__).parent)


def _mlp(layers: int) -> nn.Module:
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(8, 8), nn.ReLU()]
    return nn.Sequential(*mods)


def _proftune_lines(fn: Callable[[], Any]) -> int:
    """Lines of proftune's own code executed while ``fn`` runs (other code is not traced)."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename.startswith(PACKAGE) else None

    sys.settrace(global_)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def _profile_lines(layers: int, *, inference: bool) -> int:
    model, x = _mlp(layers), torch.randn(4, 8)
    return _proftune_lines(lambda: proftune.profile(model, example_input=x, inference=inference,
                                                    device="cpu", steps=1, warmup=0))


def _increment_ratio(inference: bool, n: int) -> float:
    f = {k: _profile_lines(k, inference=inference) for k in (n, 2 * n, 4 * n)}
    return (f[4 * n] - f[2 * n]) / (f[2 * n] - f[n])


def test_training_profile_bookkeeping_is_linear_in_layers() -> None:
    ratio = _increment_ratio(False, 4)
    assert ratio < 2.03, ratio  # linear: 2.0 exactly; quadratic: > 2


@pytest.mark.slow
def test_inference_profile_bookkeeping_is_linear_in_layers() -> None:
    ratio = _increment_ratio(True, 8)
    assert ratio < 2.03, ratio


class _CountedName(str):
    """A layer name that counts the hashes and comparisons made of it: work that one line hides
    (``name in a_list`` compares it with every name before it) shows in the count."""

    ops = 0

    def __hash__(self) -> int:
        _CountedName.ops += 1
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        _CountedName.ops += 1
        return str.__eq__(self, other)

    def __lt__(self, other: str) -> bool:
        _CountedName.ops += 1
        return str.__lt__(self, other)


def test_layer_timer_summary_is_linear_in_layers() -> None:
    def ops(layers: int) -> int:
        timer = _timing.LayerTimer(nn.Identity())
        names = [_CountedName(f"layer.{i}") for i in range(layers)]
        _CountedName.ops = 0
        timer._begin()
        for _ in range(3):  # three steps closed as the hooks leave them: forward pieces, backward starts
            timer._fwd = {n: 1.0 for n in names}
            timer._events = [(i * 1e-3, n) for i, n in enumerate(names)]
            timer.mark_backward_end(layers * 1e-3)
            timer.end_step(2.0 * layers)  # each layer: 1 ms forward, 1 ms backward
        assert len(timer.per_layer()) == layers
        assert timer.typical_step_ms() == pytest.approx((2.0 * layers, 0.0), abs=1e-6)
        return _CountedName.ops

    # counted, not timed: linear code costs the same per layer (exactly 8x), a list lookup per
    # layer 64x
    ratio = ops(8000) / ops(1000)
    assert ratio < 8.5, ratio
