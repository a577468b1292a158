"""The options of one :func:`proftune.search` call, as one frozen record.

``search(task, space, trials=40, sampler="tpe")`` and
``search(task, space, config=SearchConfig(trials=40, sampler="tpe"))`` are the same call; keyword
options given beside ``config`` override its fields. Each option alone is checked where the
search validates them together (one error naming every problem).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError

if TYPE_CHECKING:
    from optuna.pruners import BasePruner
    from optuna.samplers import BaseSampler

    from ..track import RunRecord
    from ._ray_session import RayOptions

__all__ = ["SearchConfig", "search_config"]


@dataclass(frozen=True)
class SearchConfig:
    """How a search runs: what it optimizes, how many trials and how long, how it samples and
    prunes, where its trials train, and what it writes."""

    # -- what is optimized --------------------------------------------------------------------
    #: ``"accuracy:max"``-style, one (best trial) or several (Pareto front); None: the registry's
    #: default for the task's metrics (``accuracy:max`` when it reports accuracy, else ``val_loss:min``).
    objectives: Sequence[str] | None = None
    #: ``"step_time_ms<50"``-style, on task or profile metrics; profile ones gate a trial before it trains.
    constraints: Sequence[str] = ()
    #: Fixed for every trial, over the space's ``fixed:``; a param the space searches is an error.
    params: Mapping[str, Any] | None = None
    # -- how much -----------------------------------------------------------------------------
    #: The study's trained trials (complete, pruned, failed in user code), so that the same
    #: ``study`` again continues it.
    trials: int = 20
    #: Seconds this call may take (None: no bound).
    timeout: float | None = None
    #: Trials failed in user code before the search stops.
    max_failures: int = 5
    #: Trials gated before training, counted apart (None: ten per trial, at least 20).
    max_gated: int | None = None
    # -- how it samples and prunes ------------------------------------------------------------
    #: A key of ``SAMPLERS`` (``"tpe"``, ``"sobol"``, ...) or your own Optuna ``BaseSampler``.
    sampler: str | BaseSampler = "tpe"
    #: A key of ``PRUNERS`` (``"median"``, ``"asha"``, ...) or your own Optuna ``BasePruner``.
    pruner: str | BasePruner = "none"
    #: The first pass of ``sampler="coarse-to-fine"``: ``"halton"`` or ``"grid"``.
    coarse: str = "halton"
    #: Points per continuous param of a grid (``sampler="grid"``, ``coarse="grid"``).
    grid_points: int = 5
    seed: int = 0
    #: The share of ``trials`` spent re-evaluating the leading configurations; where ``trials`` is
    #: known, as many again try their neighbours, at the end of the budget (noise-aware selection,
    #: :mod:`proftune.search._reeval`, :mod:`proftune.search._refine`); None: 0.25 for a plain
    #: objective, 0 (off, every trial a new configuration, the best single draw named best) for a Task.
    reevaluate: float | None = None
    #: Configurations to train first (Optuna's ``enqueue_trial``), each
    #: ``{"params": {...}, "tags": {...}}``; the tags come back in ``TrialRecord.tags``; an item's
    #: ``"repeat": n`` (the params' evaluations before it) trains it at a new seed (``seed + n``).
    enqueue: Sequence[Mapping[str, Any]] = ()
    #: A folder: each complete trial of one objective that leads the trials its worker ran so far
    #: leaves its model's state dict there (``trial-<number>.pt``), so that a caller who would train
    #: the search's best again at the same seed and epochs can take that training instead (the
    #: optimize loop's race does). None: no model is kept.
    keep_models: str | None = None
    # -- each trial ---------------------------------------------------------------------------
    #: Epochs per trial (None with ``max_steps`` None: the task's own).
    epochs: int | None = None
    max_steps: int | None = None
    device: str = "auto"
    #: Steps of the profile gate before a trial trains.
    gate_steps: int = 3
    #: Halton configurations profiled before the study, restricting the space to where the hard
    #: profile constraints hold (None: 16 when there are such constraints; 0: no scan).
    scan: int | None = None
    # -- where it runs and what it writes -----------------------------------------------------
    #: The Optuna study's name in the Store's database (None: a new one).
    study: str | None = None
    #: Processes on this machine (``backend="local"``).
    workers: int = 1
    #: ``"local"`` (this machine's processes) or ``"ray"`` (Ray Tune, configured by ``ray``).
    backend: str = "local"
    ray: RayOptions | None = None
    #: A folder for the study's plots (None: none).
    plot: str | Path | None = None
    #: False skips correlations, importance and the strategy (seconds at a hundred trials): for
    #: a caller that runs a study in many short calls and reads only the trials.
    analyse: bool = True
    #: Called in this process with each trial's Run (kind ``trial``) once it has ended and is in
    #: the Store, while the study runs: after each trial here, within about a second of its end
    #: in a worker process, when the workers return under another backend (Ray). Once per
    #: trial, failed ones too (``status`` says); what it raises ends the search.
    on_trial: Callable[[RunRecord], object] | None = None

    def __post_init__(self) -> None:
        # one objective or constraint given as text is a sequence of one (a str would be read
        # character by character)
        for name in ("objectives", "constraints"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))


def search_config(config: SearchConfig | None, options: Mapping[str, Any]) -> SearchConfig:
    """``config`` (or the defaults) with the keyword ``options`` over it; an unknown option's
    name is refused with the valid ones."""
    names = [f.name for f in dataclasses.fields(SearchConfig)]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise ConfigError(f"search() got unknown option(s) {unknown}; valid: {', '.join(sorted(names))} "
                          "(and config=, store=, db=).")
    return dataclasses.replace(config or SearchConfig(), **options)
