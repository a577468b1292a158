"""Short runs that confirm or refute a schedule finding, through the one fit loop.

``decay_probe`` continues the trained model (with its optimizer's state) twice over the same
batches, at the run's rate and at a tenth of it: a noisy floor that the lower rate lowers is the
rate's noise (no decay). ``warmup_probe`` re-runs the first steps from the same init and batches
with a linear warm-up: an early spike that warm-up removes was the missing warm-up.
"""

from __future__ import annotations

import copy
import math
import statistics

import torch
from torch import nn
from torch.optim.optimizer import StateDict

from .._train_params import TrainParams
from ..task import Task
from ..train import Callback, FitResult, FitState, fit
from ._history import DecayProbe, NanProbe, WarmupProbe

__all__ = ["NAN_PROBE_FACTOR", "decay_probe", "nan_probe", "warmup_probe"]


class _SetLR(Callback):
    """Sets every group's lr to ``lr * factor(step)`` before each step; optionally loads an
    optimizer state first (a continuation keeps its momentum and Adam moments)."""

    def __init__(self, lr: float, *, warmup: int = 0, state: StateDict | None = None) -> None:
        self.lr, self.warmup, self.state = lr, warmup, state

    def on_fit_start(self, state: FitState) -> None:
        if self.state is not None and state.optimizer is not None:
            state.optimizer.load_state_dict(copy.deepcopy(self.state))

    def on_step_start(self, state: FitState) -> None:
        if state.optimizer is None:
            return
        factor = min(1.0, (state.step + 1) / self.warmup) if self.warmup else 1.0
        for group in state.optimizer.param_groups:
            group["lr"] = self.lr * factor


def _losses(result: FitResult) -> list[float]:
    return [float(r["loss"]) for r in result.curves["step"]]


def decay_probe(task: Task, params: TrainParams, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                lr: float, steps: int, device: torch.device, seed: int, factor: float = 0.1) -> DecayProbe:
    """Mean train loss over the second half of ``steps`` more steps at ``lr`` and at ``factor * lr``."""
    state = optimizer.state_dict()
    out: dict[str, float] = {}
    for arm, rate in (("constant", lr), ("decayed", lr * factor)):
        result = fit(task, params, max_steps=steps, device=device, seed=seed + 1, model=copy.deepcopy(model),
                     evaluate=False, callbacks=[_SetLR(rate, state=state)])
        losses = _losses(result)
        out[arm] = statistics.fmean(losses[len(losses) // 2:])
    gain = 1 - out["decayed"] / out["constant"] if out["constant"] > 0 else 0.0
    return DecayProbe(steps=steps, lr=lr, decayed_lr=lr * factor, constant_loss=out["constant"],
                      decayed_loss=out["decayed"], relative_gain=gain)


def warmup_probe(task: Task, params: TrainParams, *, lr: float, steps: int, warmup: int,
                 device: torch.device, seed: int) -> WarmupProbe:
    """The loss of the first ``steps`` steps of the same run with a linear warm-up over ``warmup``."""
    result = fit(task, params, max_steps=steps, device=device, seed=seed, evaluate=False,
                 callbacks=[_SetLR(lr, warmup=warmup)])
    return WarmupProbe(steps=steps, warmup_steps=warmup, lr=lr, losses=_losses(result))


#: The rate of the NaN probe, as a fraction of the run's: far enough below that a NaN the rate
#: drives (weights that grew) cannot come at the same step.
NAN_PROBE_FACTOR = 0.01


def nan_probe(task: Task, params: TrainParams, *, lr: float, nan_step: int, device: torch.device,
              seed: int, factor: float = NAN_PROBE_FACTOR) -> NanProbe:
    """The steps of the run up to its first non-finite loss (step ``nan_step``, 1-based) and a few
    beyond, again from the same init and batches at ``factor * lr``: the step at which the loss
    turned non-finite there (None: finite throughout), and whether the NaN follows the rate (it
    does where the lower rate stays finite past the run's step)."""
    steps = nan_step + max(5, nan_step // 10)
    result = fit(task, params, max_steps=steps, device=device, seed=seed, evaluate=False,
                 callbacks=[_SetLR(lr * factor)])
    losses = _losses(result)
    first = next((i + 1 for i, v in enumerate(losses) if not math.isfinite(v)), None)
    return NanProbe(lr=lr, probe_lr=lr * factor, factor=factor, steps=len(losses), nan_step=nan_step,
                    probe_nan_step=first, follows_lr=first is None or first > nan_step)
