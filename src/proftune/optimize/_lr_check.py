"""A computed learning rate checked on the task before the search centres on it.

The range test's rate is a hypothesis read off 100 steps of a sweep: on a plateau-start CNN it
suggested 0.0316 from a loss that only came back from 3.64 to chance (2.30), and the search then
spent its trainings around a rate that did not train. So the computed rate (at the computed batch)
and the task's own each train for the same few seconds from one seed, and the computed rate is
the search's centre only where its short run ends better on the task's metric by more than one
validation sample's worth; otherwise the centre stays the defaults' rate, and the output says so.

The defaults' side is read off their own training where it can be: the baseline trained them
from the same seed and scored each epoch, so their figure after as many whole epochs as the
seconds hold is the figure a second run would reach at that wall clock (the computed rate then
trains for those epochs' seconds). A second run of the defaults cost 5% of a budget of 8
trainings on issue 60's generated tasks, half of the compute stage's time there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._jsonsafe import finite_float
from .._train_params import TrainParams
from ..task import Task
from ..train import evaluate_model, fit
from ._budget import Deadline
from ._computed import ComputedValues, LrCheck

__all__ = ["check_computed_lr", "from_curve", "short_check_seconds"]

#: The seconds each short run trains: a share of the compute stage's, within these bounds.
MIN_SECONDS, MAX_SECONDS, SHARE = 1.0, 3.0, 0.12


def short_check_seconds(share_s: float) -> float:
    """Seconds of each of the two short runs for a compute stage of ``share_s`` seconds."""
    return min(MAX_SECONDS, max(MIN_SECONDS, SHARE * share_s))


def _short(task: Task, params: TrainParams, *, seconds: float, metric: str, device: torch.device,
           seed: int) -> tuple[float | None, int]:
    deadline = Deadline(seconds)
    result = fit(task, params, epochs=max(1, int(task.default_epochs)), device=device, seed=seed,
                 callbacks=[deadline], evaluate=False)
    metrics = evaluate_model(task, result.model, device, params.batch_size or 32)
    return finite_float(metrics.get(metric)), int(result.steps)


def from_curve(curve: Sequence[float | None], epoch_s: float | None, seconds: float) -> tuple[int, float] | None:
    """(epochs, figure): the defaults' own training after the whole epochs ``seconds`` hold at
    ``epoch_s`` seconds an epoch; None where one epoch takes longer, or the curve has no figure there."""
    if not curve or not epoch_s or epoch_s <= 0 or seconds < epoch_s:
        return None
    epochs = min(len(curve), int(seconds / epoch_s))
    value = curve[epochs - 1]
    return None if value is None else (epochs, float(value))


def check_computed_lr(task: Task, defaults: TrainParams, computed: ComputedValues, *, metric: str,
                      maximize: bool, seconds: float, device: torch.device, seed: int,
                      val_samples: int | None, defaults_curve: Sequence[float | None] = (),
                      epoch_s: float | None = None, epoch_steps: int | None = None) -> LrCheck | None:
    """The computed rate (at the computed batch) and the defaults each trained ``seconds`` from
    ``seed``; None where there is no computed rate, or it is the defaults' own. ``defaults_curve``
    (their training's figure after each epoch, from ``seed``), ``epoch_s`` and ``epoch_steps``
    (an epoch's seconds and steps at the defaults' batch): the defaults' side is read off it."""
    default_lr = None if defaults.lr is None else float(defaults.lr)
    if computed.lr is None or (default_lr is not None and math.isclose(computed.lr, default_lr, rel_tol=0.05)):
        return None
    batch = int(computed.batch_size or defaults.batch_size or 32)
    mine = defaults.with_params(lr=computed.lr, batch_size=batch)
    read = from_curve(defaults_curve, epoch_s, seconds)
    base_value: float | None
    epochs: int | None = None
    if read is not None and epoch_s is not None:
        epochs, base_value = read
        seconds, base_steps = epochs * epoch_s, epochs * (epoch_steps or 0)
    else:
        base_value, base_steps = _short(task, defaults, seconds=seconds, metric=metric, device=device, seed=seed)
    value, steps = _short(task, mine, seconds=seconds, metric=metric, device=device, seed=seed)
    margin = 1.0 / val_samples if val_samples else 0.0
    used = False
    if value is not None and base_value is not None:
        gain = (value - base_value) if maximize else (base_value - value)
        used = gain > margin
    elif value is not None:
        used = True  # the defaults' short run gave no finite metric
    return LrCheck(computed_lr=float(computed.lr), default_lr=default_lr, batch_size=batch, seconds=float(seconds),
                   metric=metric, maximize=maximize, defaults_value=base_value, computed_value=value,
                   defaults_steps=base_steps, computed_steps=steps, margin=margin, used=used,
                   defaults_epochs=epochs)
