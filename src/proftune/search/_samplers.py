"""The samplers a search can use, each an Optuna sampler (one of ours: coarse-to-fine)."""

from __future__ import annotations

import warnings

import optuna

from ..exceptions import ConfigError
from ._coarse_fine import CoarseToFineSampler
from ._settings import SearchSettings

__all__ = ["SAMPLERS", "describe_sampler", "make_sampler", "sampler_name"]

SAMPLERS = ("tpe", "halton", "sobol", "random", "grid", "coarse-to-fine", "nsga2")


def describe_sampler(sampler: optuna.samplers.BaseSampler) -> str:
    """The sampler's class, with the QMC sequence where it has one (``QMCSampler(halton)``)."""
    qmc = getattr(sampler, "_qmc_type", None)
    return f"{type(sampler).__name__}({qmc})" if qmc else type(sampler).__name__


def sampler_name(sampler: str | optuna.samplers.BaseSampler) -> str:
    """A registry key as it is; a user's own Optuna sampler by its class (``describe_sampler``)."""
    return sampler if isinstance(sampler, str) else describe_sampler(sampler)


def make_sampler(settings: SearchSettings, worker: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler called ``settings.sampler`` (a key of ``SAMPLERS``), or the user's own Optuna
    sampler as given; each worker of a named one gets its own seed."""
    if isinstance(settings.sampler, optuna.samplers.BaseSampler):
        return settings.sampler
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _make_sampler(settings, worker)


def _make_sampler(settings: SearchSettings, worker: int) -> optuna.samplers.BaseSampler:
    name, seed = settings.sampler, settings.seed + 1000 * worker
    n = settings.trials
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)  # Optuna's defaults (10 random startup trials)
    if name in ("halton", "sobol"):
        return optuna.samplers.QMCSampler(qmc_type=name, scramble=True, seed=settings.seed,
                                          warn_independent_sampling=False,
                                          warn_asynchronous_seeding=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler(settings.space.grid(settings.grid_points), seed=settings.seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, n // 4)))
    if name == "coarse-to-fine":
        grid = settings.space.grid(settings.grid_points) if settings.coarse == "grid" else None
        return CoarseToFineSampler(n_coarse=max(2, n // 2), seed=seed, grid=grid)
    raise ConfigError(f"sampler={name!r} is unknown; valid: {', '.join(SAMPLERS)}.")
