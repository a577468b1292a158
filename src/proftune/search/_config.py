"""The options of one :func:`proftune.search` call, as one frozen record, and the configurations it enqueues.

``search(task, space, trials=40, sampler="tpe")`` and
``search(task, space, config=SearchConfig(trials=40, sampler="tpe"))`` are the same call; keyword
options given beside ``config`` override its fields. Each option alone is checked where the
search validates them together (one error naming every problem); an ``enqueue`` item given as a
dict becomes an :class:`EnqueuedTrial` there, once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError, ProblemCollector

if TYPE_CHECKING:
    from optuna.pruners import BasePruner
    from optuna.samplers import BaseSampler

    from ..track import RunRecord
    from ._ray_session import RayOptions

__all__ = ["EnqueuedTrial", "SearchConfig", "enqueued_trials", "search_config"]

#: The keys of an ``enqueue`` item in its dict form.
_ENQUEUE_KEYS = ("params", "tags", "repeat")


@dataclass(frozen=True)
class EnqueuedTrial:
    """A configuration the search trains before it samples (Optuna's ``enqueue_trial``), checked
    where it is made: ``params`` (names of the space), ``tags`` that come back in
    ``TrialRecord.tags``, and ``repeat``, the evaluations of these params before this one (it
    trains at the seed ``seed + repeat``)."""

    params: Mapping[str, Any]
    tags: Mapping[str, Any] = field(default_factory=dict)
    repeat: int = 0

    def __post_init__(self) -> None:
        problems = _problems(self.params, self.tags, self.repeat)
        if problems:
            raise ConfigError(problems, header="EnqueuedTrial is not well-formed, found the following errors:")
        # copies: a caller's dict changed later does not change the queued configuration
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "tags", dict(self.tags))

    @classmethod
    def of(cls, item: EnqueuedTrial | Mapping[str, Any], *, where: str = "enqueue item") -> EnqueuedTrial:
        """An ``enqueue`` item as a record: a record as it is; the documented dict form
        ``{"params": {...}, "tags": {...}, "repeat": n}`` (each key optional) checked and converted."""
        if isinstance(item, EnqueuedTrial):
            return item
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}={item!r} must be a dict {{'params': {{...}}, 'tags': {{...}}, "
                              "'repeat': n} or an EnqueuedTrial.")
        unknown = sorted(str(k) for k in item if k not in _ENQUEUE_KEYS)
        problems = [f"{where} has unknown key(s) {unknown}; valid: {', '.join(_ENQUEUE_KEYS)}."] if unknown else []
        try:  # a key given as None: its default, as before the record
            made = cls(params=item.get("params") or {}, tags=item.get("tags") or {}, repeat=item.get("repeat") or 0)
        except ConfigError as exc:
            problems += [f"{where}: {p}" for p in exc.problems]
        if problems:
            raise ConfigError(problems)
        return made


def _problems(params: object, tags: object, repeat: object) -> list[str]:
    """What is wrong with an enqueued configuration's fields (nothing: an empty list)."""
    out = []
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        out.append(f"params={params!r} must be a mapping of param name -> value.")
    if not isinstance(tags, Mapping) or not all(isinstance(k, str) for k in tags):
        out.append(f"tags={tags!r} must be a mapping of tag name -> value.")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 0:
        out.append(f"repeat={repeat!r} must be an integer >= 0 (the evaluations of these params before this one).")
    return out


def enqueued_trials(items: Sequence[EnqueuedTrial | Mapping[str, Any]],
                    problems: ProblemCollector) -> list[EnqueuedTrial]:
    """``search(enqueue=...)`` as records, converted once at that boundary; each bad item's
    problems go to ``problems`` (named ``enqueue[i]``) and the item is left out."""
    out: list[EnqueuedTrial] = []
    if isinstance(items, (str, bytes, Mapping)):
        problems.add(f"enqueue={items!r} must be a list of dicts {{'params': {{...}}, 'tags': {{...}}, "
                     "'repeat': n} or of EnqueuedTrial.")
        return out
    for i, item in enumerate(items):
        try:
            out.append(EnqueuedTrial.of(item, where=f"enqueue[{i}]"))
        except ConfigError as exc:
            problems.problems.extend(exc.problems)
    return out


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
    #: ``{"params": {...}, "tags": {...}}`` or an :class:`EnqueuedTrial`; the tags come back in
    #: ``TrialRecord.tags``; an item's ``"repeat": n`` (the params' evaluations before it) trains it
    #: at a new seed (``seed + n``). A param the space does not hold is an error.
    enqueue: Sequence[EnqueuedTrial | Mapping[str, Any]] = ()
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
