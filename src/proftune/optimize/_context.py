"""What a stage of the optimize loop is given: :class:`StageContext`, the public contract between
the loop and its stages (the built-in ones and a plug-in's alike).

A stage's ``run(ctx, share, end)`` reads everything the loop shares through it: the task, the
options, the Store, the records of the stages before it, the clock and the plan of the budget.
The loop (``_api.py``) is one implementation; a test may pass any object with these members.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from .._holdout import HoldoutInfo
    from .._train_params import TrainParams
    from ..task import Task
    from ..track import Store
    from ._budget_plan import BudgetPlan
    from ._config import OptimizeConfig, Validated
    from ._search_records import ConfigGroup
    from ._state import OptimizeState

__all__ = ["StageClock", "StageContext"]


class StageClock(Protocol):
    """The run's wall clock, as a stage reads it (seconds; ``end`` is a ``time.monotonic()``)."""

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


class StageContext(Protocol):
    """What every stage shares, handed to :meth:`BaseStage.run`, ``skipped`` and ``on_end``.

    The records of the stages before it are ``ctx.state.record(TheirOutputs)`` (each a frozen
    :class:`StageOutputs`); ``ctx.state.finished(name)`` says whether a stage has run.
    """

    #: The task (all of its validation data selects) and where its held-out figures come from.
    task: Task
    #: The task's default params, validated: the bar every configuration is compared with.
    defaults: dict[str, Any]
    #: The same params as the record they were validated in once: a training of the defaults takes it.
    defaults_record: TrainParams
    #: The options as given, and parsed (``v.metric``, ``v.maximize``, ``v.budget_s``, ...).
    cfg: OptimizeConfig
    v: Validated
    store: Store
    #: ``state.json``: each stage's status and record, saved after every stage.
    state: OptimizeState
    #: The output folder (a stage's files are named relative to it in its record).
    out: Path
    dev: torch.device
    #: The Optuna study the search writes to; the spec ``load_task`` finds the task by.
    study: str
    spec: str
    holdout: HoldoutInfo
    #: ``say(event, data)``: a progress event for the terminal (``--json`` prints none).
    say: Callable[[str, dict[str, Any]], None]

    @property
    def budget(self) -> StageClock:
        """The run's clock (read-only: the loop's own :class:`Budget` is one)."""

    def budget_plan(self, *, search_done: bool = False) -> BudgetPlan:
        """What the seconds left hold at the task's own protocol, from the times measured so far."""

    def epoch_s(self) -> float:
        """Seconds of one epoch of the defaults, as the baseline measured it."""

    def compress_reserve(self) -> float:
        """Seconds kept for the compress stage (0 with ``goal="none"``)."""

    def rank_epoch(self) -> int | None:
        """The first epoch at which the defaults' curve separated from its start (None: never)."""

    def baseline_reusable(self) -> bool:
        """Whether the baseline's training of the defaults is their first seed in the race."""

    def race_seeds_for(self, defaults: ConfigGroup | None, best: ConfigGroup | None,
                       pooled: float | None, *, compared: int = 1) -> int:
        """Paired seeds the race needs for ``best`` against ``defaults`` as the search measured them
        (the best of ``compared`` trials on the same validation data)."""
