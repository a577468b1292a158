"""The samplers a search can use: each a registered :class:`BaseSamplerMaker` that builds an
Optuna sampler for one search (one of ours: coarse-to-fine). A user's own sampler registers the
same way (``@register_sampler``, or the ``proftune.samplers`` entry point group), and its key is
then valid for ``tune --sampler``; a ready Optuna ``BaseSampler`` instance is taken as it is."""

from __future__ import annotations

import abc
import warnings
from typing import ClassVar, TypeVar

import optuna

from .._registry import LiveSequence, Registry
from ._coarse_fine import CoarseToFineSampler
from ._settings import SearchSettings

__all__ = ["SAMPLERS", "SAMPLER_REGISTRY", "BaseSamplerMaker", "describe_sampler", "make_sampler",
           "register_sampler", "sampler_name"]


class BaseSamplerMaker(abc.ABC):
    """Builds the Optuna sampler called ``name`` for one search."""

    #: The key ``--sampler`` and ``sampler=`` take.
    name: ClassVar[str] = ""

    @abc.abstractmethod
    def make(self, settings: SearchSettings, *, seed: int) -> optuna.samplers.BaseSampler:
        """The sampler for ``settings`` (its space, trials, grid points); ``seed`` is this worker's."""


#: Every sampler by name, in the order ``--help`` lists them.
SAMPLER_REGISTRY: Registry[BaseSamplerMaker] = Registry(
    "sampler", key=lambda m: m.name, entry_points="proftune.samplers")
#: The valid ``--sampler`` keys, read from the registry.
SAMPLERS = LiveSequence(lambda: SAMPLER_REGISTRY.names())

M = TypeVar("M")


def register_sampler(maker: M) -> M:
    """Register a :class:`BaseSamplerMaker` subclass (built with no arguments) or instance;
    usable as a class decorator."""
    return SAMPLER_REGISTRY.add_named(maker, base=BaseSamplerMaker, arg="sampler",
                        public="proftune.search.BaseSamplerMaker")


SAMPLER_REGISTRY.loads_through(register_sampler)


@register_sampler
class _TPE(BaseSamplerMaker):
    name = "tpe"

    def make(self, settings: SearchSettings, *, seed: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(seed=seed)  # Optuna's defaults (10 random startup trials)


class _QMC(BaseSamplerMaker):
    def make(self, settings: SearchSettings, *, seed: int) -> optuna.samplers.BaseSampler:
        # one scrambled sequence shared by the workers (each draws the study's next point)
        return optuna.samplers.QMCSampler(qmc_type=self.name, scramble=True, seed=settings.seed,
                                          warn_independent_sampling=False, warn_asynchronous_seeding=False)


@register_sampler
class _Halton(_QMC):
    name = "halton"


@register_sampler
class _Sobol(_QMC):
    name = "sobol"


@register_sampler
class _Random(BaseSamplerMaker):
    name = "random"

    def make(self, settings: SearchSettings, *, seed: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=seed)


@register_sampler
class _Grid(BaseSamplerMaker):
    name = "grid"

    def make(self, settings: SearchSettings, *, seed: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.GridSampler(settings.space.grid(settings.grid_points), seed=settings.seed)


@register_sampler
class _CoarseToFine(BaseSamplerMaker):
    name = "coarse-to-fine"

    def make(self, settings: SearchSettings, *, seed: int) -> optuna.samplers.BaseSampler:
        grid = settings.space.grid(settings.grid_points) if settings.coarse == "grid" else None
        return CoarseToFineSampler(n_coarse=max(2, settings.trials // 2), seed=seed, grid=grid)


@register_sampler
class _NSGA2(BaseSamplerMaker):
    name = "nsga2"

    def make(self, settings: SearchSettings, *, seed: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, settings.trials // 4)))


def describe_sampler(sampler: optuna.samplers.BaseSampler) -> str:
    """The sampler's class, with the QMC sequence where it has one (``QMCSampler(halton)``)."""
    qmc = getattr(sampler, "_qmc_type", None)
    return f"{type(sampler).__name__}({qmc})" if qmc else type(sampler).__name__


def sampler_name(sampler: str | optuna.samplers.BaseSampler) -> str:
    """A registry key as it is; a user's own Optuna sampler by its class (``describe_sampler``)."""
    return sampler if isinstance(sampler, str) else describe_sampler(sampler)


def make_sampler(settings: SearchSettings, worker: int = 0, *, earlier: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler called ``settings.sampler`` (a key of ``SAMPLERS``), or the user's own Optuna
    sampler as given; each worker of a named one gets its own seed, and so does each tune of the
    study after the first (``earlier``: the tunes of it recorded before this one)."""
    if isinstance(settings.sampler, optuna.samplers.BaseSampler):
        return settings.sampler
    maker = SAMPLER_REGISTRY.get_entry(settings.sampler)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return maker.make(settings, seed=settings.seed + 1000 * worker + 7919 * earlier)
