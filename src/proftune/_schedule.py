"""A task's learning-rate schedule in the fit loop: what ``Task.configure_scheduler`` returned,
when the loop steps it (its interval: after every optimizer step, or once per epoch), and the one
warning for a schedule that reads as counted in epochs but is stepped per step.

``configure_scheduler`` returns a scheduler (stepped per step, the default) or, as Lightning's
``lr_scheduler`` config, ``{"scheduler": s, "interval": "epoch" | "step"}`` (with ``"monitor"``,
the metric a ``ReduceLROnPlateau`` is stepped with, default ``val_loss``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .exceptions import ConfigError, TaskWarning

__all__ = ["INTERVALS", "Schedule", "per_epoch_reading", "run_epochs", "schedule_from", "warn_if_per_epoch"]

#: When the fit loop steps a task's scheduler; the first is the default.
INTERVALS = ("step", "epoch")
_KEYS = ("scheduler", "interval", "monitor")
#: A per-step reading whose mean lr is this many times below the per-epoch one is "far too fast".
_TOO_FAST = 4.0


@dataclass
class Schedule:
    """A task's scheduler and when the loop steps it; ``stated``: the task said the interval."""

    scheduler: Any
    interval: str = "step"
    monitor: str = "val_loss"
    stated: bool = False

    @property
    def plateau(self) -> bool:
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def step_after_epoch(self, metrics: dict[str, float]) -> None:
        """Step an epoch-interval scheduler (a plateau one with its ``monitor`` metric)."""
        if not self.plateau:
            self.scheduler.step()
            return
        if self.monitor not in metrics:
            raise ConfigError(f"configure_scheduler's monitor={self.monitor!r} is not a metric of this task; "
                              f"valid: {', '.join(sorted(metrics)) or '(none: the run does not evaluate)'}.")
        self.scheduler.step(float(metrics[self.monitor]))


def schedule_from(value: Any, *, owner: str) -> Schedule | None:
    """What ``configure_scheduler`` returned, checked: None, a scheduler, or its config dict."""
    if value is None:
        return None
    if not isinstance(value, dict):
        schedule = Schedule(value)
    else:
        problems = [f"key {k!r} is unknown; valid: {', '.join(_KEYS)}" for k in value if k not in _KEYS]
        if value.get("scheduler") is None:
            problems.append("'scheduler' is missing")
        interval = value.get("interval", INTERVALS[0])
        if interval not in INTERVALS:
            problems.append(f"interval={interval!r} is unknown; valid: {', '.join(INTERVALS)}")
        if problems:
            raise ConfigError([f"{owner}.configure_scheduler returned a dict whose {p}." for p in problems])
        schedule = Schedule(value["scheduler"], interval=interval, monitor=str(value.get("monitor", "val_loss")),
                            stated="interval" in value)
    if not callable(getattr(schedule.scheduler, "step", None)):
        raise ConfigError(f"{owner}.configure_scheduler returned {type(schedule.scheduler).__name__}, which has no "
                          "step(); return a torch.optim.lr_scheduler scheduler, "
                          "{'scheduler': s, 'interval': 'epoch' | 'step'}, or None.")
    if schedule.plateau and schedule.interval == "step":
        raise ConfigError(f"{owner}.configure_scheduler returned a ReduceLROnPlateau, which steps on a metric "
                          "once per epoch; return {'scheduler': s, 'interval': 'epoch', 'monitor': 'val_loss'}.")
    return schedule


def per_epoch_reading(scheduler: Any, *, epochs: float, steps_per_epoch: int) -> str | None:
    """Why ``scheduler`` reads as counted in epochs though it is stepped after every step, or None.

    A StepLR or MultiStepLR whose counts fall within the run's ``epochs``, or an ExponentialLR,
    whose lr averaged over the run, stepped ``steps_per_epoch`` times an epoch, is at least 4x
    below the same schedule stepped once an epoch; a CosineAnnealingLR whose ``T_max`` falls
    within the run's epochs (stepped per step, it repeats its cycle many times)."""
    lr = torch.optim.lr_scheduler
    if steps_per_epoch < 2 or epochs <= 0:
        return None
    steps = epochs * steps_per_epoch
    name = type(scheduler).__name__

    def too_fast(factor: Any, what: str) -> str | None:
        per_step, per_epoch = _mean(factor, steps), _mean(factor, epochs)
        if per_step * _TOO_FAST > per_epoch:
            return None
        return (f"{what}; stepped after each of the {steps_per_epoch} optimizer steps of an epoch, its lr "
                f"averages {per_step:.2g}x its start over the run, against {per_epoch:.2g}x stepped once per epoch")

    if isinstance(scheduler, lr.StepLR):
        size, gamma = int(scheduler.step_size), float(scheduler.gamma)
        if size > epochs:
            return None
        return too_fast(lambda t: gamma ** (t // size), f"{name}(step_size={size}) counts within the run's "
                        f"{epochs:g} epochs")
    if isinstance(scheduler, lr.MultiStepLR):
        marks = np.array(sorted(int(m) for m in scheduler.milestones.elements()))
        gamma = float(scheduler.gamma)
        if not len(marks) or marks[-1] > epochs:
            return None
        return too_fast(lambda t: gamma ** np.searchsorted(marks, t, side="right"),
                        f"{name}(milestones={marks.tolist()}) falls within the run's {epochs:g} epochs")
    if isinstance(scheduler, lr.ExponentialLR):
        gamma = float(scheduler.gamma)
        if not 0 < gamma < 1:
            return None
        return too_fast(lambda t: gamma ** t, f"{name}(gamma={gamma:g})")
    if isinstance(scheduler, lr.CosineAnnealingLR):
        t_max = int(scheduler.T_max)
        if t_max > epochs or steps <= 2 * t_max:
            return None
        cycles = steps / (2 * t_max)
        return (f"{name}(T_max={t_max}) counts within the run's {epochs:g} epochs; stepped after each of the "
                f"{steps_per_epoch} optimizer steps of an epoch, its lr goes down and back up {cycles:.0f} times")
    return None


def _mean(factor: Any, count: float) -> float:
    """The mean of ``factor(t)`` over the steps ``t = 0 .. count - 1`` (on an even sample of
    100,000 of them where there are more)."""
    n = int(count)
    t = np.floor(np.linspace(0, n, min(n, 100_000), endpoint=False))
    return float(np.mean(factor(t)))


#: (task, scheduler class) pairs that warned in this process: one warning, not one per training.
_WARNED: set[tuple[str, str]] = set()


def warn_if_per_epoch(schedule: Schedule, *, task: str, epochs: float, steps_per_epoch: int) -> str | None:
    """Warn once (a :class:`TaskWarning`) where a per-step schedule reads as counted in epochs; the
    reason, or None. A schedule whose task stated its interval is taken as meant."""
    if schedule.interval != "step" or schedule.stated:
        return None
    why = per_epoch_reading(schedule.scheduler, epochs=epochs, steps_per_epoch=steps_per_epoch)
    key = (task, type(schedule.scheduler).__name__)
    if why is None or key in _WARNED:
        return why
    _WARNED.add(key)
    warnings.warn(f"task {task!r}: its scheduler looks counted in epochs but the fit loop steps it after every "
                  f"optimizer step: {why}. To step it once per epoch, return "
                  "{'scheduler': s, 'interval': 'epoch'} from configure_scheduler; if per step is meant, "
                  "return {'scheduler': s, 'interval': 'step'}.", TaskWarning, stacklevel=2)
    return why


def run_epochs(epochs: int | None, max_steps: int | None, steps_per_epoch: int) -> float:
    """The run's length in epochs: ``epochs``, or ``max_steps`` at ``steps_per_epoch``."""
    if epochs is not None:
        return float(epochs)
    return math.ceil((max_steps or 0) / max(steps_per_epoch, 1))
