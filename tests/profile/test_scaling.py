"""Profiling's bookkeeping grows linearly with the number of layers, never quadratically.

Counted, not timed: the lines of proftune's own code that run while profiling MLPs of n, 2n and
4n layers. Linear code costs the same per added layer, so the count's increments are in ratio
exactly 2; one loop over the layers seen so far, run at each layer call, pushes it to 2.08 at
these sizes (checked by planting one in ``LayerTimer._on_leaf``). Work hidden inside one line
(``name in a_list``) is caught by timing the per-layer summary itself at two sizes.
"""

from __future__ import annotations

import sys
import time
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


def test_layer_timer_summary_is_linear_in_layers() -> None:
    def seconds(layers: int) -> float:
        timer = _timing.LayerTimer(nn.Identity())
        names = [f"layer.{i}" for i in range(layers)]
        timer.steps = [({n: 1.0 for n in names}, {n: 2.0 for n in names}) for _ in range(3)]
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            timer.per_layer()
            best = min(best, time.process_time() - t0)
        return max(best, 1e-6)

    seconds(100)  # warm
    ratio = seconds(8000) / seconds(1000)
    assert ratio < 24, ratio  # linear: 8x; quadratic: 64x
