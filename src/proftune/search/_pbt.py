"""Population-based training on Ray Tune: the ladders the perturbed params move along, the
seeded synchronous scheduler and population, each member's trials recorded in the study, and the
plot of their schedules. ``_ray.py`` (the backend) runs them."""

from __future__ import annotations

import copy
import functools
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import optuna

from ._records import ATTR, SchedulePoint, TrialFigures
from ._settings import SearchSettings
from ._space import Param, Space

__all__ = ["MEMBER", "PERTURBABLE", "ladder", "pbt_class", "pbt_plot", "population_class",
           "population_space", "record_population", "rung"]

#: Params that population-based training perturbs while a member trains.
PERTURBABLE = ("lr", "weight_decay", "momentum", "dropout")
#: The config key that numbers the members of the initial population (not a param).
MEMBER = "pbt_member"


def population_space(base: Mapping[str, object], space: Space, size: int) -> dict[str, object]:
    """PBT's initial population: member 0 at each param's start (its ``default``), the others
    spread along each perturbed param's ladder around it, nearest rungs first (0, -1, +1, -2, ...).

    A population that all starts at one harmful value is damaged alike in its first epoch (a
    learning rate 10x too high ruins an MLP in a few steps) and has nobody to exploit.
    """
    from ray import tune

    out = dict(base)  # the space as Ray samples it, every member starting at the defaults
    out[MEMBER] = tune.grid_search(list(range(size)))
    for p in space.params:
        if p.name in PERTURBABLE:
            rungs = ladder(p)
            home = rungs.index(p.center()) if p.center() in rungs else 0
            order = sorted(range(len(rungs)), key=functools.partial(_distance, home))
            out[p.name] = tune.sample_from(functools.partial(_member_value, [rungs[i] for i in order]))
    return out


def _distance(home: int, i: int) -> tuple[int, int]:
    return abs(i - home), i


def _member_value(values: list[Any], spec: Any) -> Any:
    return values[int(spec.config[MEMBER]) % len(values)]


def ladder(param: Param) -> list[Any]:
    """The values PBT moves a param between, one rung per perturbation, through its default.

    Log-scale params step by half a decade (x3.16), others by an eighth of their range (or
    their ``step``); Ray's own perturbation (x0.8 / x1.2) needs many intervals to leave a
    harmful start (a learning rate 10x too high) and steps outside the declared range.
    """
    if param.type == "categorical":
        return list(param.choices)
    assert param.low is not None
    assert param.high is not None
    start = param.center()
    anchor = float(start)
    if param.log:
        ratio = math.sqrt(10.0)
        below = math.floor(math.log(anchor / param.low, ratio) + 1e-9)
        above = math.floor(math.log(param.high / anchor, ratio) + 1e-9)
        raw = [anchor * ratio**k for k in range(-below, above + 1)]
    else:
        step = float(param.step or (param.high - param.low) / 8)
        below = math.floor((anchor - param.low) / step + 1e-9)
        above = math.floor((param.high - anchor) / step + 1e-9)
        raw = [anchor + k * step for k in range(-below, above + 1)]
    ladder: list[Any] = []
    for v in raw:  # the anchor exactly (the start value is found on the ladder), others rounded
        snapped = start if v == anchor else param.snap(v)
        if isinstance(snapped, float) and v != anchor:
            snapped = float(f"{snapped:.12g}")
        if snapped not in ladder:
            ladder.append(snapped)
    return ladder


def pbt_class() -> type:
    from ray.tune.schedulers import PopulationBasedTraining

    class _LadderPBT(PopulationBasedTraining):
        """Synchronous PBT whose exploit and explore depend on the members' scores and the seed only.

        Each round (every member at the same epoch) the lower quantile continues from the upper
        quantile's checkpoints, two members per parent, the best parent first (the worst two
        take the best). Of each two, one moves the perturbed params a rung along their ladders
        and the other the opposite way; which way per param is drawn from a generator seeded by
        ``seed``, so with one param the best member is bracketed a rung up and a rung down. A
        run depends neither on which Ray worker reports first nor on Ray's unseeded ``random``,
        which picks a parent at random and resamples a quarter of the time.
        """

        def __init__(self, *, seed: int, **kw: Any) -> None:
            super().__init__(**kw)
            self._rng = random.Random(seed)
            #: Each exploiting member's rank in this round's lower quantile (0: the worst).
            self._rank: dict[Any, int] = {}
            #: Each pair's directions (+1/-1 per param): its first member explores them, the other their opposite.
            self._directions: dict[int, list[int]] = {}

        def _checkpoint_or_exploit(self, trial: Any, tune_controller: Any, upper_quantile: list[Any],
                                   lower_quantile: list[Any]) -> None:
            if trial in lower_quantile:  # both quantiles are sorted worst first
                rank = self._rank[trial] = lower_quantile.index(trial)
                upper_quantile = [upper_quantile[-1 - (rank // 2) % len(upper_quantile)]]
            super()._checkpoint_or_exploit(trial, tune_controller, upper_quantile, lower_quantile)

        def _get_new_config(self, trial: Any, trial_to_clone: Any) -> tuple[dict[str, object], dict[str, str]]:
            rank = self._rank.pop(trial, 0)
            if rank % 2 == 0 or rank // 2 not in self._directions:
                self._directions[rank // 2] = [self._rng.choice((-1, 1)) for _ in self._hyperparam_mutations]
            sign = 1 if rank % 2 == 0 else -1
            config, operations = copy.deepcopy(trial_to_clone.config), {}
            for direction, (name, ladder) in zip(self._directions[rank // 2], self._hyperparam_mutations.items(),
                                                  strict=True):
                config[name], operations[name] = rung(list(cast(list[Any], ladder)),
                                                       trial_to_clone.config.get(name), sign * direction)
            return config, operations

    return _LadderPBT


def population_class() -> type:
    from ray.tune.search.basic_variant import BasicVariantGenerator

    class _Population(BasicVariantGenerator):
        """PBT's members (seeded), a search that ends only when its last member does.

        Tune keeps a stopped trial's actor for the next trial only while the search goes on or
        a trial is staged; at a round of synchronous PBT, the member that reported last and
        exploits another is stopped with none staged, and each such round started a new Ray
        worker (importing torch and the task: 5 s on a quiet machine, 15-25 s on a busy one).
        """

        _generating = False
        _stop_requested = False

        def next_trial(self) -> Any:
            self._generating = True
            try:
                return super().next_trial()
            finally:
                self._generating = False

        def set_finished(self) -> None:
            if not self._generating:  # the experiment stops (time budget): nothing waits for members
                self._stop_requested = True
            super().set_finished()

        def is_finished(self) -> bool:
            return bool(super().is_finished() and (self._stop_requested or not self._live_trials))

    return _Population


def rung(ladder: list[Any], value: Any, direction: int) -> tuple[Any, str]:
    """The value one rung from ``value`` along ``ladder``, and how it moved.

    At the ladder's end the move goes two rungs the other way: the other member of the pair
    goes one rung that way, and a copy of the parent's own value would train the same as it.
    """
    if value not in ladder:  # off the ladder (a resumed experiment's older ladder): its nearest rung
        try:
            return min(ladder, key=lambda v: abs(float(v) - float(value))), "snap"
        except (TypeError, ValueError):
            return ladder[0], "snap"
    at = ladder.index(value)
    to = at + direction if 0 <= at + direction < len(ladder) else at - 2 * direction
    to = min(max(to, 0), len(ladder) - 1)
    return ladder[to], "up" if to > at else "down" if to < at else "stay"


def record_population(settings: SearchSettings, storage: Any,
                       records: list[tuple[int, dict[str, object], str, list[float] | None, TrialFigures]],
                       ) -> dict[int, int]:
    """PBT has no searcher: add each member to the study as a finished trial, with its record.

    Returns each member's number in the study, by its number among the members.
    """
    study = optuna.load_study(study_name=settings.study, storage=storage)
    dists = {p.name: p.distribution() for p in settings.space.params}
    added: dict[int, int] = {}
    for member, config, state, values, rec in sorted(records, key=lambda r: r[0]):
        params = {k: v for k, v in config.items() if k in dists}
        for key, v in params.items():  # a perturbed value may leave the declared range
            params[key] = _clip(dists[key], v)
        tstate = {"complete": optuna.trial.TrialState.COMPLETE,
                  "infeasible": optuna.trial.TrialState.COMPLETE,
                  "pruned": optuna.trial.TrialState.PRUNED}.get(state, optuna.trial.TrialState.FAIL)
        rec.params = {k: v for k, v in config.items() if k != MEMBER}
        attrs = {**rec.user_attrs_raw, ATTR: rec.to_dict(), **({f"{ATTR}_failed": True} if state == "failed" else {})}
        trial = optuna.trial.create_trial(
            params=params, distributions={k: dists[k] for k in params},
            values=values if tstate == optuna.trial.TrialState.COMPLETE else None,
            state=tstate, user_attrs=attrs)
        study.add_trial(trial)
        added[member] = study.get_trials(deepcopy=False)[-1].number
    return added


def _clip(dist: Any, value: Any) -> Any:
    low, high = getattr(dist, "low", None), getattr(dist, "high", None)
    if low is None or high is None:
        return value
    v = min(max(value, low), high)
    return round(v) if isinstance(low, int) and not isinstance(low, bool) else float(v)


def pbt_plot(schedule: Mapping[str, list[SchedulePoint]], path: str | Path) -> Path:
    """Each PBT member's params and objective over epochs, one panel each (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for pts in schedule.values() for p in pts for k in p if k not in ("epoch",)})
    fig, axes = plt.subplots(len(keys), 1, figsize=(7, 2.2 * max(1, len(keys))), squeeze=False)
    for ax, key in zip(axes[:, 0], keys, strict=True):
        for member, pts in schedule.items():
            xs = [p["epoch"] for p in pts if p.get(key) is not None]
            ys = [p[key] for p in pts if p.get(key) is not None]
            ax.plot(xs, ys, marker="o", ms=3, label=f"member {member}")
        ax.set_ylabel(key)
        if key in ("lr", "weight_decay"):
            ax.set_yscale("log")
    axes[-1, 0].set_xlabel("epoch")
    axes[0, 0].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
