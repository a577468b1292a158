"""Coarse-to-fine: a Halton or grid pass over the whole space, then a fine pass around the best few.

One Optuna sampler, so a study resumed from the database picks up where it stopped: the stage
of a trial follows from how many trials have finished.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler, GridSampler, QMCSampler, RandomSampler
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

__all__ = ["CoarseToFineSampler"]


class CoarseToFineSampler(BaseSampler):
    """Halton over the whole space for ``n_coarse`` trials, then samples near the ``top_k`` best.

    The fine pass draws each numeric param from a normal around one of the best trials' values
    (``width`` of the range, in log space for log params), clipped to the range; categorical
    params keep one of the best trials' choices with probability 0.8.
    """

    def __init__(self, *, n_coarse: int, top_k: int = 3, width: float = 0.1,
                 seed: int | None = None, grid: dict[str, list[Any]] | None = None) -> None:
        """``grid``: coarse pass over these points (Optuna's GridSampler) instead of Halton."""
        self.n_coarse, self.top_k, self.width = int(n_coarse), int(top_k), float(width)
        self._coarse: BaseSampler
        if grid is not None:
            self._coarse = GridSampler(grid, seed=seed)
            size = 1
            for values in grid.values():
                size *= len(values)
            self.n_coarse = min(self.n_coarse, size)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self._coarse = QMCSampler(qmc_type="halton", scramble=True, seed=seed,
                                          warn_independent_sampling=False,
                                          warn_asynchronous_seeding=False)
        self._random = RandomSampler(seed=seed)
        self._rng = np.random.RandomState(seed)
        self._fine: dict[int, list[FrozenTrial]] = {}

    def reseed_rng(self) -> None:
        self._coarse.reseed_rng()
        self._random.reseed_rng()
        self._rng.seed()

    def _centers(self, study: optuna.Study, trial: FrozenTrial) -> list[FrozenTrial] | None:
        """The best trials around which ``trial`` samples, or None while still coarse."""
        if trial.number in self._fine:
            return self._fine[trial.number]
        done = study._get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED),
                                 use_cache=True)
        if len(done) < self.n_coarse:
            return None
        feasible = [t for t in done if t.state == TrialState.COMPLETE
                    and all(v <= 0 for v in t.constraints.values())]
        if not feasible:
            return None
        sign = -1.0 if study.directions[0] == StudyDirection.MAXIMIZE else 1.0
        best = sorted(feasible, key=lambda t: sign * float(t.values[0]))[: self.top_k]
        self._fine[trial.number] = best
        return best

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._centers(study, trial) is None:
            return self._coarse.infer_relative_search_space(study, trial)
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if self._centers(study, trial) is None:
            return self._coarse.sample_relative(study, trial, search_space)
        return {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        centers = self._centers(study, trial)
        if centers is None:
            return self._coarse.sample_independent(study, trial, param_name, param_distribution)
        values = [t.params[param_name] for t in centers if param_name in t.params]
        if not values:
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        return self._near(values, param_distribution)

    def _near(self, values: Sequence[Any], dist: BaseDistribution) -> Any:
        center = values[self._rng.randint(len(values))]
        if isinstance(dist, CategoricalDistribution):
            if self._rng.rand() < 0.8:
                return center
            return dist.choices[self._rng.randint(len(dist.choices))]
        assert isinstance(dist, (FloatDistribution, IntDistribution))
        low, high = float(dist.low), float(dist.high)
        if dist.log:
            lo, hi, c = math.log(low), math.log(high), math.log(float(center))
        else:
            lo, hi, c = low, high, float(center)
        x = float(np.clip(self._rng.normal(c, self.width * (hi - lo)), lo, hi))
        value = math.exp(x) if dist.log else x
        step = dist.step
        if step is not None:
            value = low + round((value - low) / step) * step
        value = min(max(value, low), high)
        return round(value) if isinstance(dist, IntDistribution) else float(value)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self._centers(study, trial) is None:
            self._coarse.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        if self._fine.pop(trial.number, None) is None and not isinstance(self._coarse, GridSampler):
            # the grid sampler's after_trial stops the study once its grid is used up
            self._coarse.after_trial(study, trial, state, values)
