"""A short learning-rate range test, to confirm or refute an lr finding.

It is the range test of :func:`proftune.recommend.lr_find` (one sweep through the fit loop, on a
fresh model with the task's own init, so a broken init stays broken), read for diagnosis: the
rate at the lowest smoothed loss is the largest at which the loss still falls. A current rate
above it is too high; one far below it, with a loss that does fall at higher rates, too low.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .._records import JsonRecord, mapping, record_fields
from .._train_params import TrainParams
from ..task import Task

__all__ = ["RangeTest", "lr_range_test"]


@dataclass(frozen=True)
class RangeTest(JsonRecord):
    """The sweep: rates, smoothed losses, and what they say.

    ``best_lr`` is the rate at the lowest smoothed loss; ``diverged_lr`` the rate at which the
    smoothed loss passed 4x its minimum (None if it never did); ``improved`` whether the loss fell
    at all (by 5% of its start) during the sweep.
    """

    WHAT: ClassVar[str] = "an LR range test"

    best_lr: float = math.nan
    diverged_lr: float | None = None
    start_loss: float = math.nan
    min_loss: float = math.nan
    improved: bool = False
    steps: int = 0
    message: str | None = None
    #: The sweep: its rates and smoothed losses (after what it says in the JSON).
    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float | str | None]:
        """What the sweep says, without the sweep itself (a finding's evidence)."""
        return {"best_lr": self.best_lr, "diverged_lr": self.diverged_lr, "start_loss": self.start_loss,
                "min_loss": self.min_loss, "improved": self.improved, "steps": self.steps,
                "message": self.message}

    @classmethod
    def from_dict(cls, d: Any) -> RangeTest:
        """The record back from :meth:`to_dict`'s JSON (a NaN written as null reads as NaN again)."""
        kw = record_fields(cls, mapping(d, what=cls.WHAT), what=cls.WHAT)

        def num(v: Any) -> float:
            return math.nan if v is None else float(v)

        for key in ("best_lr", "start_loss", "min_loss"):
            if key in kw:
                kw[key] = num(kw[key])
        for key in ("lrs", "losses"):
            kw[key] = [num(v) for v in kw.get(key) or []]
        return cls(**kw)


def lr_range_test(
    task: Task,
    params: TrainParams | Mapping[str, Any],
    *,
    steps: int = 100,
    lr_min: float = 1e-6,
    lr_max: float = 10.0,
    device: str | torch.device = "auto",
    seed: int = 0,
) -> RangeTest:
    """Sweep the learning rate of ``task`` with ``params`` (the range test of
    :func:`proftune.recommend.lr_find`, through the fit loop) and read it as a :class:`RangeTest`."""
    from ..recommend import lr_find

    found = lr_find(task, params, min_lr=lr_min, max_lr=lr_max, steps=steps, device=device, seed=seed)
    losses = [float(v) for v in found.smoothed]
    finite = [v for v in losses if math.isfinite(v)]
    start = finite[0] if finite else math.nan
    low = min(finite) if finite else math.nan
    # no readable minimum: the loss rose from the smallest rate on, or never fell
    best = found.lr_at_min_loss if found.lr_at_min_loss is not None else (
        lr_min if found.diverged or (finite and finite[-1] > start) else lr_max)
    return RangeTest(
        lrs=[float(v) for v in found.lrs], losses=losses, best_lr=float(best),
        diverged_lr=float(found.lrs[-1]) if found.diverged and found.lrs else None,
        start_loss=start, min_loss=low, improved=found.suggested_lr is not None,
        steps=found.steps, message=found.message,
    )
