"""What a stage of the optimize loop is given: :class:`StageContext`, the public contract between
the loop and its stages (the built-in ones and a plug-in's alike).

A stage's ``run(ctx, share, end)`` reads everything the loop shares through it: the task, the
options, the Store, the records of the stages before it, the clock and the plan of the budget
(``ctx.planner``, :class:`Planner`). The loop (``_api.py``) is one implementation; a test may pass
any object with these members.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ._planner import Planner, StageClock

if TYPE_CHECKING:
    import torch

    from .._holdout import HoldoutInfo
    from .._train_params import TrainParams
    from ..task import Task
    from ..track import Store
    from ._config import OptimizeConfig, Validated
    from ._state import OptimizeState

__all__ = ["StageClock", "StageContext"]


class StageContext(Protocol):
    """What every stage shares, handed to :meth:`BaseStage.run`, ``skipped`` and ``on_end``.

    The records of the stages before it are ``ctx.state.record(TheirOutputs)`` (each a frozen
    :class:`StageOutputs`); ``ctx.state.finished(name)`` says whether a stage has run.
    """

    #: The task (all of its validation data selects) and where its held-out figures come from.
    task: Task
    #: The task's default params, validated: the bar every configuration is compared with.
    defaults: Mapping[str, object]
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
    say: Callable[[str, dict[str, object]], None]

    @property
    def budget(self) -> StageClock:
        """The run's clock (read-only: the loop's own :class:`Budget` is one)."""

    @property
    def planner(self) -> Planner:
        """The plan of the budget from what the stages measured so far (``planner.budget_plan()``,
        ``epoch_s()``, ``compress_reserve()``, ``rank_epoch()``, ``baseline_reusable()``,
        ``race_seeds_for(...)``); it reads the clock when asked."""
