"""The plan of the optimize loop's budget, made again from what the stages measured so far: a
stage reads it as ``ctx.planner`` (:class:`Planner`), so the loop neither plans nor is called back.

The planner reads exactly what it plans from: the stages' records (``state.json``), the options,
the clock (its ``left_s`` read when a plan is asked for, not when the planner was made), the
held-out data's size and the output folder (where the baseline's model is kept).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .._jsonsafe import finite_float
from ..train import NONFINITE_STOP
from ._budget_plan import (
    COMPRESS_RESERVE_S,
    FULL_TRIALS_AT_LEAST,
    MAX_ROUNDS,
    MIN_COMPRESS_S,
    RESERVED_CANDIDATES,
    RUN_OVERHEAD_S,
    BudgetPlan,
    paired_seeds_needed,
    plan_budget,
    rankable_epoch,
)
from ._decide import ALPHA, prior_seed_std
from ._records import BaselineOutputs, SearchStageOutputs

if TYPE_CHECKING:
    from .._holdout import HoldoutInfo
    from ._config import Validated
    from ._search_records import ConfigGroup
    from ._state import OptimizeState

__all__ = ["Planner", "StageClock"]


class StageClock(Protocol):
    """The run's wall clock, as a stage and the plan read it (seconds; ``end`` is a ``time.monotonic()``)."""

    @property
    def elapsed_s(self) -> float:
        """Seconds the run has spent, earlier processes of a resumed run included."""

    @property
    def left_s(self) -> float:
        """Seconds left to the stages (the outputs' reserve excluded)."""

    @property
    def end(self) -> float:
        """``time.monotonic()`` by which every stage must be done."""

    def stage_s(self, stage: str) -> float:
        """Seconds for ``stage`` now: its share of what is left among it and the stages after it."""


class Planner:
    """What the seconds left hold at the task's own protocol (``full_epochs``), from the times the
    stages measured so far: the budget's plan, the race's seeds, the compress stage's reserve."""

    def __init__(self, *, state: OptimizeState, v: Validated, clock: StageClock, holdout: HoldoutInfo,
                 out: Path, full_epochs: int) -> None:
        self.state, self.v, self.clock, self.holdout, self.out = state, v, clock, holdout, out
        self.full_epochs = full_epochs

    def epoch_s(self) -> float:
        """Seconds of one epoch of the defaults, as the baseline measured it."""
        return max(float(self.state.record(BaselineOutputs).epoch_s or 1.0), 1e-3)

    def _race_seeds(self) -> int:
        """Paired seeds the race plans for: enough to detect, at the decision's confidence, the
        gain the search measured given the seeds' spread (``--seeds`` at least; before the
        search, ``--seeds``)."""
        if not self.state.finished("search"):
            return int(self.v.cfg.seeds)
        srch = self.state.record(SearchStageOutputs)
        return self.race_seeds_for(srch.defaults, srch.best, srch.seed_std, compared=srch.trials)

    def race_seeds_for(self, defaults: ConfigGroup | None, best: ConfigGroup | None, pooled: float | None, *,
                       compared: int = 1) -> int:
        """Paired seeds for the race of ``best`` against ``defaults`` as the search measured them
        (``pooled``: the seeds' spread over every group it repeated; ``compared``: the trials the
        search ran on the same validation data), planned at the level the race decides at (its
        challengers share the error rate).

        The search's best is the best of ``compared`` draws on one validation set: its gain is
        inflated by about the sampling noise of one figure there (binomial, sqrt(p (1 - p) / n))
        times sqrt(2 ln compared). The race plans for the gain that remains (issue 60: on 300
        samples the search's +0.04 planned three seeds, which cannot show the +0.02 left)."""
        low = int(self.v.cfg.seeds)
        if best is None or defaults is None:
            return low
        from ._decide import metric_resolution, winners_curse

        curse = winners_curse(self.v.metric, self.holdout.val_samples, finite_float(defaults.mean), compared)
        gain = max(0.0, abs(best.mean - defaults.mean) - curse)
        # the paired difference spreads by both arms' seeds: where each was measured (the defaults
        # at a rate too high spread many times the leader), their own figures, else the pooled one
        own = [g.std for g in (defaults, best) if g.std is not None and g.n >= 2]
        spread = math.sqrt(sum(x * x for x in own) / 2) if len(own) == 2 else pooled
        if spread is not None and pooled is not None:
            spread = max(spread, pooled)
        std = prior_seed_std(spread, metric=self.v.metric, val_samples=self.holdout.val_samples,
                             level=finite_float(defaults.mean))
        return paired_seeds_needed(seed_std=std, gain=gain,
                                   resolution=metric_resolution(self.v.metric, self.holdout.val_samples),
                                   alpha=ALPHA / RESERVED_CANDIDATES, low=low, high=max(low, MAX_ROUNDS))

    def budget_plan(self, *, search_done: bool = False) -> BudgetPlan:
        """What the seconds left hold at the task's own protocol (made again from measured times
        before each stage that depends on it)."""
        full = self.full_epochs
        # the stages before the search that have not run yet take their shares from what is left
        pending = [s for s in ("health", "compute", "layer_value") if not self.state.finished(s)]
        after = self.compress_reserve() + sum(self.clock.stage_s(s) for s in pending)
        seeds, finalists = self._race_seeds(), 1 if search_done else RESERVED_CANDIDATES

        def plan(trial_epochs: int) -> BudgetPlan:
            return plan_budget(full_epochs=full, epoch_s=self.epoch_s(), run_overhead_s=RUN_OVERHEAD_S,
                               left_s=self.clock.left_s, spent_s=self.clock.elapsed_s,
                               budget_s=self.v.budget_s, after_s=after, seeds=seeds, finalists=finalists,
                               trial_epochs=trial_epochs, search_done=search_done,
                               done_runs=self._race_runs_done(trial_epochs))

        return plan(self._trial_epochs(plan(full).search_s))

    def _race_runs_done(self, trial_epochs: int) -> int:
        """The race's first-seed trainings made before it: the baseline's of the defaults, and the
        search's of its best where the trials run the task's own epochs (their models kept)."""
        if not self.baseline_reusable():
            return 0
        if self.state.finished("search"):
            return 1 + bool(self.state.record(SearchStageOutputs).kept)
        return 1 + (trial_epochs >= self.full_epochs)

    def baseline_reusable(self) -> bool:
        """Whether the baseline's training of the defaults ran their own epochs to the end (or until
        its loss turned non-finite: where the training was going) and left its model: then it is the
        defaults' first seed in the race (not trained again)."""
        if not self.state.finished("baseline"):
            return True  # planned for: the baseline trains the defaults at their own protocol
        base = self.state.record(BaselineOutputs)
        diverged = (base.defaults.stop_reason or "").startswith(NONFINITE_STOP)
        return (base.model is not None and (self.out / base.model).is_file()
                and ((base.defaults.epochs or 0) >= self.full_epochs or diverged)
                and base.defaults.metrics.get(self.v.metric) is not None)

    def _trial_epochs(self, seconds: float) -> int:
        """Epochs of every search trial and of the race's candidates: the task's own (the
        protocol the defaults are judged by), unless the search's time cannot hold about three
        trials of them; never fewer than the epochs at which the defaults' curve could rank."""
        full = self.full_epochs
        if seconds >= FULL_TRIALS_AT_LEAST * full * self.epoch_s():
            return full
        rank_at = self.rank_epoch()
        floor = full if rank_at is None else rank_at
        return max(1, floor, min(full, int(seconds / (FULL_TRIALS_AT_LEAST * self.epoch_s()))))

    def rank_epoch(self) -> int | None:
        """The first epoch at which the defaults' own curve had separated from its start (1 before
        the baseline measured it; None: it never did, so no shorter protocol ranks)."""
        if not self.state.finished("baseline"):
            return 1
        base = self.state.record(BaselineOutputs)
        if base.start_metric is None or not base.curve:
            return 1  # a state written before the curve was kept
        return rankable_epoch(base.start_metric, base.curve, maximize=self.v.maximize,
                              val_samples=self.holdout.val_samples)

    def compress_reserve(self) -> float:
        """Seconds kept for compression: a fifth of the budget, within what one sweep needs."""
        if self.v.cfg.goal == "none":
            return 0.0
        return min(COMPRESS_RESERVE_S, max(MIN_COMPRESS_S, 0.2 * self.v.budget_s))
