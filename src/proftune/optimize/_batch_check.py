"""A computed batch checked on the task before the search centres on it.

The critical batch is read off a few steps of gradient noise at initialisation: on a CNN of 366
noisy-label samples it gave batch 1 (seven steps of 4x4 samples), the search centred there, and its
first trial, at batch 2, took 11 of the budget's 36 s where the defaults' batch 16 trained in 4.5.
The step-time model behind the batch's "effect" (linear in the batch from one measured batch)
misses what a step costs whatever its size. So the computed batch is timed over a few steps, and
the search centres on it only where it leaves at least ``MIN_STEPS_PER_EPOCH`` steps an epoch and
its epoch costs at most ``MAX_EPOCH_COST`` times the defaults' (the baseline's no-tricks run, timed
the same way); otherwise on the batch nearest it, towards the defaults', that does both (its rate
rescaled by the rule that scaled it), and the output says why.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ..recommend import Recommendations
from ..task import Task
from ..train import fit
from ._budget import Deadline
from ._computed import BatchCheck, ComputedValues

__all__ = ["MAX_EPOCH_COST", "MIN_STEPS_PER_EPOCH", "check_computed_batch", "checked_batch"]

#: Fewer steps an epoch than this leave the rate's schedule and the pruner's epochs little to act on.
MIN_STEPS_PER_EPOCH = 8
#: A computed batch whose epoch costs more than this many times the defaults' is not the centre.
MAX_EPOCH_COST = 2.0
#: Steps timed at the computed batch (the no-tricks run times the defaults' batch over as many).
TIMED_STEPS = 12


def _epoch_s(step_s: float, batch: int, samples: int | None) -> float | None:
    return step_s * math.ceil(samples / batch) if samples else None


def _lr_factor(rule: str | None, old: int, new: int) -> float:
    """What the rate computed for batch ``old`` is multiplied by at batch ``new`` under ``rule``."""
    if rule == "linear":
        return new / old
    if rule == "sqrt":
        return math.sqrt(new / old)
    return 1.0


def check_computed_batch(task: Task, defaults: dict[str, Any], batch: int, *, samples: int | None,
                         default_epoch_s: float | None, lr_scaling: str | None, device: torch.device,
                         seed: int) -> BatchCheck | None:
    """The computed ``batch`` timed over ``TIMED_STEPS`` steps and judged against the defaults'
    epoch (``default_epoch_s``); None where it is the defaults' own batch."""
    own = int(defaults.get("batch_size") or 32)
    if batch == own:
        return None
    limit = samples // MIN_STEPS_PER_EPOCH if samples else None
    if limit is not None and limit < 2:
        limit = None  # a set this small cannot give eight steps an epoch at any batch: not judged by it
    result = fit(task, {**defaults, "batch_size": batch}, max_steps=TIMED_STEPS, epochs=None, device=device,
                 seed=seed, evaluate=False, callbacks=[Deadline(5.0)])
    step_s = result.duration_s / max(result.steps, 1)
    epoch_s = _epoch_s(step_s, batch, samples)
    costly = epoch_s is not None and default_epoch_s is not None and epoch_s > MAX_EPOCH_COST * default_epoch_s
    few_steps = limit is not None and batch > limit
    if not costly and not few_steps:
        return BatchCheck(computed_batch=batch, default_batch=own, samples=samples, step_ms=step_s * 1e3,
                          epoch_s=epoch_s, default_epoch_s=default_epoch_s, batch=batch, lr_factor=1.0,
                          reason=f"the computed batch {batch} ({_fmt_epoch(epoch_s)} an epoch at "
                                 f"{step_s * 1e3:.3g} ms a step, the defaults' {_fmt_epoch(default_epoch_s)}) "
                                 "is the search's centre")
    new = _nearest_affordable(batch, own, step_s, samples, default_epoch_s, limit) if costly else int(limit or own)
    why = (f"its epoch would take {_fmt_epoch(epoch_s)} ({step_s * 1e3:.3g} ms a step over "
           f"{math.ceil((samples or 0) / batch)} steps), more than {MAX_EPOCH_COST:g}x the defaults' "
           f"{_fmt_epoch(default_epoch_s)}" if costly else
           f"it leaves {math.ceil((samples or 0) / batch)} step(s) an epoch of {samples} samples "
           f"(fewer than {MIN_STEPS_PER_EPOCH})")
    factor = _lr_factor(lr_scaling, batch, new)
    return BatchCheck(computed_batch=batch, default_batch=own, samples=samples, step_ms=step_s * 1e3,
                      epoch_s=epoch_s, default_epoch_s=default_epoch_s, batch=new, lr_factor=factor,
                      reason=f"the computed batch {batch} is not the search's centre: {why}; the centre is batch "
                             f"{new}" + (f" (the computed rate x{factor:.3g}, by the {lr_scaling} rule)"
                                         if factor != 1.0 else "") + f"; batch {batch} stays in the space")


def _fmt_epoch(s: float | None) -> str:
    return "-" if s is None else f"{s:.3g} s"


def _nearest_affordable(batch: int, own: int, step_s: float, samples: int | None, default_epoch_s: float | None,
                        limit: int | None) -> int:
    """The batch nearest ``batch`` on the way to the defaults' ``own`` (doubling or halving) whose
    epoch, at a step time interpolated between the two measured batches, costs at most
    ``MAX_EPOCH_COST`` times the defaults' and leaves enough steps; ``own`` where none does."""
    if samples is None or default_epoch_s is None:
        return own
    own_step_s = default_epoch_s / max(1, math.ceil(samples / own))
    slope = (own_step_s - step_s) / (own - batch)
    b = batch
    while (b < own) if batch < own else (b > own):
        b = min(own, b * 2) if batch < own else max(own, b // 2)
        if b == own:
            break
        epoch = _epoch_s(max(step_s + slope * (b - batch), 1e-6), b, samples)
        if epoch is not None and epoch <= MAX_EPOCH_COST * default_epoch_s and (limit is None or b <= limit):
            return b
    return own


def checked_batch(task: Task, defaults: dict[str, Any], computed: ComputedValues, recs: Recommendations, *,
                  samples: int | None, default_epoch_s: float | None, device: torch.device,
                  seed: int) -> tuple[ComputedValues, BatchCheck | None]:
    """``computed`` with its batch checked (moved, its rate rescaled, where the check says so)."""
    if computed.batch_size is None:
        return computed, None
    rule = next((str(r.value) for r in recs if r.name == "lr_scaling"), None)
    check = check_computed_batch(task, defaults, computed.batch_size, samples=samples,
                                 default_epoch_s=default_epoch_s, lr_scaling=rule, device=device, seed=seed)
    if check is None or not check.moved:
        return computed, check
    lr = computed.lr * check.lr_factor if computed.lr is not None else None
    return dataclasses.replace(computed, batch_size=check.batch, lr=lr), check
