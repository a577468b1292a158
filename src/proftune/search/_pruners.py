"""Pruners: Optuna's median and successive halving, and a patience rule that is correct.

Optuna's ``PatientPruner`` waits ``patience + 1`` reports and reads ``min_delta`` as a
tolerance for getting *worse* (it prunes only when the recent best falls more than
``min_delta`` below the earlier best), so a trial that creeps up by less than ``min_delta``
forever is never stopped. :class:`PatiencePruner` follows the rule users expect (Keras,
Lightning's EarlyStopping): stop when the best value has not improved by more than
``min_delta`` for ``patience`` consecutive reports.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping
from typing import ClassVar, TypeVar

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection

from .._registry import LiveSequence, Registry
from ..exceptions import ConfigError

__all__ = ["PRUNERS", "PRUNER_REGISTRY", "BasePrunerMaker", "NoiseAwareHalvingPruner", "PatiencePruner",
           "make_pruner", "pruner_name", "register_pruner"]



class BasePrunerMaker(abc.ABC):
    """Builds the Optuna pruner called ``name`` from the space file's ``pruner:`` options."""

    #: The key ``--pruner`` and ``pruner=`` take.
    name: ClassVar[str] = ""
    #: The options it reads from the space file's ``pruner:`` section, each ``int`` or ``float``
    #: (a space file may give only the options some registered pruner reads).
    option_types: ClassVar[dict[str, str]] = {}

    @abc.abstractmethod
    def make(self, options: Mapping[str, float]) -> BasePruner:
        """The pruner, with ``options`` from the space file's ``pruner:`` section (numbers, each of
        the type ``option_types`` gives it)."""


#: Every pruner by name (``proftune.pruners`` entry points included).
PRUNER_REGISTRY: Registry[BasePrunerMaker] = Registry(
    "pruner", key=lambda m: m.name, entry_points="proftune.pruners")
#: The valid ``--pruner`` keys, read from the registry.
PRUNERS = LiveSequence(lambda: PRUNER_REGISTRY.names())

P = TypeVar("P")


def register_pruner(maker: P) -> P:
    """Register a :class:`BasePrunerMaker` subclass (built with no arguments) or instance;
    usable as a class decorator."""
    return PRUNER_REGISTRY.add_named(maker, base=BasePrunerMaker, arg="pruner",
                        public="proftune.search.BasePrunerMaker")


PRUNER_REGISTRY.loads_through(register_pruner)


class PatiencePruner(BasePruner):
    """Prune when the best reported value has not improved by > ``min_delta`` in ``patience`` reports.

    NaN reports count as no improvement. An improvement smaller than ``min_delta`` does not
    reset the count, and the best value moves only on a real improvement.
    """

    def __init__(self, patience: int, min_delta: float = 0.0) -> None:
        if isinstance(patience, bool) or int(patience) < 1:
            raise ConfigError(f"patience must be an integer >= 1, but got {patience=}.")
        if not math.isfinite(min_delta) or min_delta < 0:
            raise ConfigError(f"min_delta must be >= 0, but got {min_delta=}.")
        self.patience, self.min_delta = int(patience), float(min_delta)

    def reports_since_improvement(self, values: list[float], *, maximize: bool) -> int:
        """How many reports in a row have not improved on the best by more than ``min_delta``."""
        best: float | None = None
        wait = 0
        for v in values:
            if math.isnan(v):
                wait += 1
                continue
            if best is None or (v > best + self.min_delta if maximize else v < best - self.min_delta):
                best, wait = v, 0
            else:
                wait += 1
        return wait

    def prune(self, study: optuna.study.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if not trial.intermediate_values:
            return False
        values = [trial.intermediate_values[s] for s in sorted(trial.intermediate_values)]
        maximize = study.direction == StudyDirection.MAXIMIZE
        return self.reports_since_improvement(values, maximize=maximize) >= self.patience


def pruner_options() -> dict[str, str]:
    """Every option a registered pruner reads from the space file, with its type (``int``, ``float``)."""
    out: dict[str, str] = {}
    for maker in PRUNER_REGISTRY.values():
        for key, kind in maker.option_types.items():
            out.setdefault(key, kind)
    return out


def pruner_name(pruner: str | BasePruner) -> str:
    """A registry key as it is; a user's own Optuna pruner by its class."""
    return pruner if isinstance(pruner, str) else type(pruner).__name__


def make_pruner(name: str | BasePruner, options: Mapping[str, float]) -> BasePruner:
    """The pruner called ``name`` (a key of ``PRUNERS``) with options from the space file's
    ``pruner:`` section, or the user's own Optuna pruner as given."""
    if isinstance(name, BasePruner):
        return name
    return PRUNER_REGISTRY.get_entry(name).make(dict(options))


@register_pruner
class _NoPruner(BasePrunerMaker):
    name = "none"

    def make(self, options: Mapping[str, float]) -> BasePruner:
        return optuna.pruners.NopPruner()


@register_pruner
class _Median(BasePrunerMaker):
    name = "median"
    option_types: ClassVar[dict[str, str]] = {"n_startup_trials": "int", "n_warmup_steps": "int"}

    def make(self, options: Mapping[str, float]) -> BasePruner:
        return optuna.pruners.MedianPruner(n_startup_trials=int(options.get("n_startup_trials", 4)),
                                           n_warmup_steps=int(options.get("n_warmup_steps", 0)))


class NoiseAwareHalvingPruner(BasePruner):
    """Successive halving that does not rank by noise: Optuna's rule (at rung ``k``, step
    ``min_resource * reduction_factor**k``, a trial goes on while it is among the best
    ``1/reduction_factor`` of those that reached the rung), except that a trial within ``margin`` of
    the rung's promotion cut goes on too.

    ``margin`` is the noise of one figure (a validation accuracy on 200 samples moves by about 0.035
    between equally good models): the halving's cut between two trials 0.02 apart is a coin toss,
    and with the few trials a short budget holds it pruned slow starters the full training would
    have ranked first (a rate 80x the defaults', cut at epoch 7 of 60 at 0.355 against 0.375).
    ``margin`` 0 is Optuna's pruner exactly.
    """

    def __init__(self, min_resource: int = 1, reduction_factor: int = 3, margin: float = 0.0) -> None:
        if not math.isfinite(margin) or margin < 0:
            raise ConfigError(f"pruner margin={margin!r} must be a finite number >= 0.")
        self.halving = optuna.pruners.SuccessiveHalvingPruner(min_resource=min_resource,
                                                               reduction_factor=reduction_factor)
        self.reduction_factor, self.margin = reduction_factor, margin

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if not self.halving.prune(study, trial):
            return False
        value = trial.intermediate_values.get(trial.last_step) if trial.last_step is not None else None
        if self.margin <= 0 or value is None or not math.isfinite(value):
            return True
        # the rung the halving judged it at: the last one it recorded for the trial
        attrs = study._storage.get_trial_system_attrs(trial._trial_id)
        rung = 0
        while f"completed_rung_{rung + 1}" in attrs:
            rung += 1
        key = f"completed_rung_{rung}"
        others = [float(t.system_attrs[key]) for t in study.get_trials(deepcopy=False)
                  if key in t.system_attrs and t.number != trial.number]
        competing = sorted([*others, float(value)])
        place = max(len(competing) // self.reduction_factor - 1, 0)
        maximize = study.direction == StudyDirection.MAXIMIZE
        cut = competing[-(place + 1)] if maximize else competing[place]
        behind = (cut - value) if maximize else (value - cut)
        return behind > self.margin


@register_pruner
class _ASHA(BasePrunerMaker):
    name = "asha"
    option_types: ClassVar[dict[str, str]] = {"min_resource": "int", "reduction_factor": "int", "margin": "float"}

    def make(self, options: Mapping[str, float]) -> BasePruner:
        return NoiseAwareHalvingPruner(min_resource=int(options.get("min_resource", 1)),
                                       reduction_factor=int(options.get("reduction_factor", 3)),
                                       margin=float(options.get("margin", 0.0)))


@register_pruner
class _Patience(BasePrunerMaker):
    name = "patience"
    option_types: ClassVar[dict[str, str]] = {"patience": "int", "min_delta": "float"}

    def make(self, options: Mapping[str, float]) -> BasePruner:
        return PatiencePruner(int(options.get("patience", 2)), float(options.get("min_delta", 0.0)))
