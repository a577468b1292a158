"""How the learning rate moves when the batch size changes: linear for SGD, square root for Adam.

- SGD (with or without momentum): the update is lr·mean gradient; k times the batch averages
  away k times the variance, and keeping the SDE of the dynamics the same needs lr·k (Goyal et
  al. 2017, "Accurate, Large Minibatch SGD"; Smith & Le 2018).
- Adam family (Adam, AdamW, RMSprop, Adagrad, Adafactor, LAMB, ...): the update is normalised by
  the gradient's second moment, so the noise in the update scales like 1/sqrt(B) and the
  matching rule is lr·sqrt(k) (Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive
  Gradient Algorithms"; Hoffer et al. 2017).
Both rules hold below the critical batch size; past it, a bigger batch buys little and the lr
should stop growing (McCandlish et al. 2018).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from .._records import JsonRecord
from ..exceptions import ConfigError

_LINEAR = ("sgd",)
_SQRT = ("adam", "adamw", "adamax", "nadam", "radam", "rmsprop", "adagrad", "adadelta", "adafactor",
         "lamb", "lion", "sparseadam")


@dataclass(frozen=True)
class ScalingRule(JsonRecord):
    """The lr for ``to_batch`` given a good lr at ``from_batch``, with the rule and why."""

    WHAT: ClassVar[str] = "a scaling rule"

    rule: str  # "linear" | "sqrt"
    optimizer: str
    from_batch: int
    to_batch: int
    from_lr: float
    lr: float
    factor: float
    reason: str
    capped_at: int | None = None


def optimizer_family(optimizer: str | torch.optim.Optimizer | type) -> tuple[str, str]:
    """``(name, rule)`` for an optimizer instance, class or name: rule is 'linear' or 'sqrt'."""
    if isinstance(optimizer, torch.optim.Optimizer):
        name = type(optimizer).__name__
    elif isinstance(optimizer, type):
        name = optimizer.__name__
    else:
        name = str(optimizer)
    key = name.lower().replace("_", "")
    if key in _LINEAR:
        return name, "linear"
    if key in _SQRT or key.endswith("adam") or key.endswith("adamw"):
        return name, "sqrt"
    raise ConfigError(
        f"optimizer={name!r} has no known lr scaling rule; known: {', '.join(_LINEAR + _SQRT)}."
    )


def scale_lr(
    lr: float,
    *,
    from_batch: int,
    to_batch: int,
    optimizer: str | torch.optim.Optimizer | type = "adamw",
    critical_batch: int | None = None,
) -> ScalingRule:
    """Scale ``lr`` found at ``from_batch`` to ``to_batch`` with the rule of ``optimizer``.

    With ``critical_batch``, growth stops there: beyond the critical batch a bigger batch does
    not cut the number of steps, so a bigger lr only adds instability.
    """
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ConfigError(f"lr={lr!r} must be a positive, finite number.")
    if from_batch < 1 or to_batch < 1:
        raise ConfigError(f"batch sizes must be >= 1, but got {from_batch=}, {to_batch=}.")
    name, rule = optimizer_family(optimizer)
    effective = to_batch
    capped = None
    if critical_batch is not None and to_batch > max(critical_batch, from_batch):
        effective = max(critical_batch, from_batch)
        capped = effective
    k = effective / from_batch
    factor = k if rule == "linear" else math.sqrt(k)
    if rule == "linear":
        reason = (f"{name} is plain SGD: the update is lr x mean gradient, so {k:.3g}x the batch "
                  f"needs {factor:.3g}x the lr to keep the same noise per sample (linear rule, "
                  "Goyal et al. 2017).")
    else:
        reason = (f"{name} normalises the update by the gradient's second moment, so its noise "
                  f"falls like 1/sqrt(B): {k:.3g}x the batch needs sqrt({k:.3g}) = {factor:.3g}x "
                  "the lr (square-root rule, Malladi et al. 2022).")
    if capped is not None:
        reason += (f" Scaled only up to the critical batch size {capped}: past it a bigger batch "
                   "saves no steps, so the lr should not grow further.")
    return ScalingRule(rule=rule, optimizer=name, from_batch=int(from_batch), to_batch=int(to_batch),
                       from_lr=float(lr), lr=float(lr) * factor, factor=factor, reason=reason,
                       capped_at=capped)
