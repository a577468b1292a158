"""A computed batch checked against what an epoch costs at it, before anything trains with it.

A batch computed from the noise scale can be tiny where the gradients measured a plateau's first
fall (batch 2 for 900 samples on a plateau-start CNN: each epoch 450 optimizer steps, 3x the
defaults' epoch time, and a search that spent 4 of its 6 trainings there). So the computed batch's
epoch is timed against the defaults' epoch on this machine (alternated rounds at one thread,
each batch's fastest run, which a burst of load elsewhere does not move; a step timed by its wall
clock, from one step's end to the next), and a
batch whose epoch costs more than ``MAX_EPOCH_COST`` times the defaults' is moved toward the
defaults' batch, a factor of 2 at a time, until one costs no more; the row says so, with the times.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from .._records import JsonRecord
from .._train_params import TrainParams
from ..task import Task
from ..train import Callback, FitState, fit

__all__ = ["MAX_EPOCH_COST", "BatchCost", "bound_by_cost", "step_timer"]

#: A computed batch's epoch may cost at most this many times the defaults' epoch (measured).
MAX_EPOCH_COST = 2.0
#: Paired rounds per batch checked; untimed and timed steps of each short run.
ROUNDS, WARMUP, TIMED_STEPS = 3, 2, 5

#: batch size -> one measured step time (ms) at that batch (median of a short run's timed steps);
#: inf where the task cannot train at that batch, nan where nothing was timed.
StepTimer = Callable[[int], float]


class _StepTimes(Callback):
    """Each step's wall clock, from one step's end to the next's: what an epoch pays for a step (the
    data, the phases, and the loop's own work around them). The phases alone (``state.timing``) left
    out a cost every step pays whatever its batch: on a CNN of 366 samples they timed batch 1 at 1.4 ms
    a step, 0.6x the defaults' epoch; its trainings took 4x the defaults' epoch (11.5 ms a step)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, state: FitState) -> None:
        self.ends.append(time.perf_counter())

    @property
    def ms(self) -> list[float]:
        """Each step's milliseconds but the first's (its start is not seen)."""
        return [(b - a) * 1e3 for a, b in zip(self.ends, self.ends[1:], strict=False)]


def step_timer(task: Task, params: TrainParams, *, device: torch.device, seed: int) -> StepTimer:
    """The task's training step timed at a batch: a short fit at one thread, median of its timed steps."""

    def measure(batch_size: int) -> float:
        cb = _StepTimes()
        try:
            fit(task, params, max_steps=WARMUP + TIMED_STEPS, batch_size=int(batch_size), device=device, seed=seed,
                callbacks=[cb], evaluate=False, threads=1)
        except (RuntimeError, ValueError):  # e.g. BatchNorm at batch 1: no epoch trains there at all
            return math.inf
        finite = [t for t in cb.ms[WARMUP - 1:] if math.isfinite(t)]  # cb.ms[i]: step i + 2
        return statistics.median(finite) if finite else math.nan

    return measure


@dataclass(frozen=True)
class CostCheck(JsonRecord):
    """One batch checked: its step (ms: its fastest run's median), steps an epoch, its epoch over the defaults'."""

    WHAT: ClassVar[str] = "a batch's epoch-cost check"
    batch: int
    step_ms: float
    steps_per_epoch: int
    epoch_ratio: float


@dataclass(frozen=True)
class BatchCost(JsonRecord):
    """The batch after the cost check, the batch computed before it, and every batch checked."""

    WHAT: ClassVar[str] = "a batch's epoch-cost bound"
    batch: int
    computed: int
    default_batch: int
    samples: int
    default_step_ms: float
    max_ratio: float
    checks: list[CostCheck]

    @property
    def moved(self) -> bool:
        return self.batch != self.computed

    def note(self) -> str:
        """What a recommendation's reason adds: the times, where the batch moved ("" where it did not)."""
        return f"; {self.describe()}" if self.moved else ""

    def describe(self) -> str:
        """One line: the epoch times measured, and what moved."""
        seen = ", ".join(f"batch {c.batch} {c.steps_per_epoch} steps x {c.step_ms:.3g} ms = {c.epoch_ratio:.2g}x"
                         for c in self.checks)
        head = (f"an epoch of the {self.samples} training samples timed against the defaults' (batch "
                f"{self.default_batch}, {math.ceil(self.samples / self.default_batch)} steps x "
                f"{self.default_step_ms:.3g} ms; fastest of alternated runs at one thread): {seen}")
        if not self.moved:
            return head
        return (f"{head}; batch {self.computed} costs more than {self.max_ratio:g}x the defaults' epoch, so "
                f"batch {self.batch}, the first toward the defaults' batch that costs no more")


def _epoch_ratio(timer: StepTimer, batch: int, default_batch: int, samples: int,
                 max_ratio: float = MAX_EPOCH_COST) -> tuple[float, float, float]:
    """(epoch ratio, step ms at ``batch``, step ms at the defaults' batch) from up to ``ROUNDS``
    rounds, each timing both batches back to back (their order alternating); each batch's step is
    its fastest run's: a run that a burst of load elsewhere slowed measures the load, not the batch
    (medians of paired ratios read batch 4 at 4.9x and at 1.0x the defaults' epoch in two runs).
    Rounds stop once the ratio is ``DECIDED`` times away from ``max_ratio`` either way: further
    rounds only refine a ratio the bound already decides (on a CNN at the defaults' batch of 512,
    the three rounds took 4.7 s of a 20 s budget of 8 trainings, for a ratio of about 1)."""
    mine, theirs = [], []
    for r in range(ROUNDS):
        if r % 2 == 0:
            t0, t1 = timer(default_batch), timer(batch)
        else:
            t1, t0 = timer(batch), timer(default_batch)
        if math.isfinite(t0) and t0 > 0:
            theirs.append(t0)
        if not math.isnan(t1):
            mine.append(t1)
        if mine and theirs and not _undecided(_ratio(min(mine), min(theirs), batch, default_batch, samples),
                                              max_ratio):
            break
    if not mine or not theirs:
        return math.nan, math.nan, math.nan
    # a batch the task cannot train at (inf) costs more than any bound
    t_mine, t_theirs = min(mine), min(theirs)
    return _ratio(t_mine, t_theirs, batch, default_batch, samples), t_mine, t_theirs


#: A ratio this many times below or above the bound is decided after one round of timings.
DECIDED = 1.5


def _ratio(t_mine: float, t_theirs: float, batch: int, default_batch: int, samples: int) -> float:
    return (math.ceil(samples / batch) * t_mine) / (math.ceil(samples / default_batch) * t_theirs)


def _undecided(ratio: float, max_ratio: float) -> bool:
    return math.isfinite(ratio) and max_ratio / DECIDED < ratio < max_ratio * DECIDED


def bound_by_cost(batch: int, *, default_batch: int, samples: int, timer: StepTimer,
                  max_ratio: float = MAX_EPOCH_COST) -> BatchCost | None:
    """``batch`` where its epoch costs at most ``max_ratio`` times the defaults' epoch (timed by
    ``timer``); else the first batch toward ``default_batch`` (a factor of 2 at a time) that does.
    None where there is nothing to check (the batch is the defaults', or no samples)."""
    if batch == default_batch or samples < 1 or default_batch < 1:
        return None
    checks: list[CostCheck] = []
    b, default_ms = int(batch), math.nan
    while True:
        ratio, step_ms, default_ms_b = _epoch_ratio(timer, b, default_batch, samples, max_ratio)
        if math.isfinite(default_ms_b):
            default_ms = default_ms_b
        checks.append(CostCheck(batch=b, step_ms=step_ms, steps_per_epoch=math.ceil(samples / b),
                                epoch_ratio=ratio))
        if math.isnan(ratio) or ratio <= max_ratio:
            break
        nxt = min(default_batch, 2 * b) if b < default_batch else max(default_batch, b // 2)
        if nxt == default_batch:
            b = nxt  # the defaults' batch costs the defaults' epoch: nothing to time
            break
        b = nxt
    return BatchCost(batch=b, computed=int(batch), default_batch=int(default_batch), samples=int(samples),
                     default_step_ms=default_ms, max_ratio=float(max_ratio), checks=checks)
