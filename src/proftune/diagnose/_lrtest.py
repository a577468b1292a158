"""A short learning-rate range test through the fit loop, to confirm an lr finding.

The rate grows geometrically from ``lr_min`` to ``lr_max`` over ``steps`` optimizer steps of a
fresh model (the task's own init, so a broken init stays broken); the smoothed loss is recorded
and the sweep stops once it diverges. The rate at the lowest smoothed loss is the largest rate at
which the loss still falls: a current rate above it is too high, one far below it too low.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..task import Task
from ..train import Callback, FitState, fit

__all__ = ["RangeTest", "lr_range_test"]


@dataclass(frozen=True)
class RangeTest:
    """The sweep: rates, smoothed losses, and what they say.

    ``best_lr`` is the rate at the lowest smoothed loss; ``diverged_lr`` the rate at which the
    smoothed loss passed 4x its minimum (None if it never did); ``improved`` whether the loss fell
    at all (by 5% of its start) during the sweep.
    """

    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    best_lr: float = math.nan
    diverged_lr: float | None = None
    start_loss: float = math.nan
    min_loss: float = math.nan
    improved: bool = False
    steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"best_lr": self.best_lr, "diverged_lr": self.diverged_lr, "start_loss": self.start_loss,
                "min_loss": self.min_loss, "improved": self.improved, "steps": self.steps}


class _Sweep(Callback):
    """Sets the rate before each step, smooths the loss, stops when it diverges."""

    def __init__(self, lr_min: float, lr_max: float, steps: int, beta: float = 0.9) -> None:
        self.lr_min, self.lr_max, self.steps, self.beta = lr_min, lr_max, steps, beta
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self._avg = 0.0
        self._best = math.inf
        self.diverged_lr: float | None = None

    def on_step_start(self, state: FitState) -> None:
        assert state.optimizer is not None
        frac = state.step / max(self.steps - 1, 1)
        lr = self.lr_min * (self.lr_max / self.lr_min) ** frac
        for group in state.optimizer.param_groups:
            group["lr"] = lr

    def on_step_end(self, state: FitState) -> None:
        lr = float(state.lr or math.nan)
        loss = float(state.loss if state.loss is not None else math.nan)
        if not math.isfinite(loss):
            self.diverged_lr = lr
            state.request_stop(f"lr range test: loss {loss} at lr {lr:.3g}")
            return
        self._avg = self.beta * self._avg + (1 - self.beta) * loss
        smoothed = self._avg / (1 - self.beta ** (len(self.losses) + 1))
        self.lrs.append(lr)
        self.losses.append(smoothed)
        self._best = min(self._best, smoothed)
        if len(self.losses) > 5 and smoothed > 4 * self._best:
            self.diverged_lr = lr
            state.request_stop(f"lr range test: loss diverged at lr {lr:.3g}")


def lr_range_test(
    task: Task,
    params: dict[str, Any],
    *,
    steps: int = 100,
    lr_min: float = 1e-6,
    lr_max: float = 10.0,
    device: str | torch.device = "auto",
    seed: int = 0,
) -> RangeTest:
    """Sweep the learning rate of ``task`` with ``params`` and return the :class:`RangeTest`."""
    sweep = _Sweep(lr_min, lr_max, steps)
    fit(task, params, max_steps=steps, device=device, seed=seed, callbacks=[sweep], evaluate=False,
        stop_on_nan=True)
    if not sweep.losses:
        return RangeTest(diverged_lr=sweep.diverged_lr or lr_min, best_lr=lr_min, steps=0)
    i = min(range(len(sweep.losses)), key=sweep.losses.__getitem__)
    start, low = sweep.losses[0], sweep.losses[i]
    return RangeTest(
        lrs=sweep.lrs, losses=sweep.losses, best_lr=sweep.lrs[i], diverged_lr=sweep.diverged_lr,
        start_loss=start, min_loss=low, improved=low < 0.95 * start, steps=len(sweep.losses),
    )
