"""Bandit allocation of recurring runs across training configurations (A/B tests of configs).

Each pull of an arm is one run of a configuration and its reward a measured metric. Thompson
sampling draws each arm's mean from its posterior (normal, with the variance pooled across arms)
and pulls the largest draw; UCB pulls the largest ``mean + c * s * sqrt(2 ln t / n)``. Every pull
is a row in the table ``proftune_bandit_pulls`` of the Store's database, so a bandit named the
same continues where the last process stopped. The regret curve is cumulative: against the true
means when they are known (simulation), else against the estimated means at the end.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from .._jsonsafe import json_dumps
from ..exceptions import ConfigError, ProblemCollector
from ..track import Store

__all__ = ["POLICIES", "Arm", "ArmStats", "Bandit", "BanditPulls", "regret_curve", "simulate"]

POLICIES = ("thompson", "ucb", "uniform")

_metadata = sa.MetaData()
pulls_table = sa.Table(
    "proftune_bandit_pulls",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("bandit", sa.String(255), nullable=False, index=True),
    sa.Column("arm", sa.String(255), nullable=False),
    sa.Column("reward", sa.Float, nullable=False),
    sa.Column("policy", sa.String(32), nullable=False),
    sa.Column("run_id", sa.Integer, nullable=True),
    sa.Column("created_at", sa.String(40), nullable=False),
)


@dataclass(frozen=True)
class Arm:
    """One configuration: a name and the params it sets."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class ArmStats:
    """What the pulls of one arm say: count, mean and standard deviation of the reward."""

    name: str
    pulls: int = 0
    total: float = 0.0
    total_sq: float = 0.0

    @property
    def mean(self) -> float:
        return self.total / self.pulls if self.pulls else math.nan

    @property
    def std(self) -> float:
        if self.pulls < 2:
            return math.nan
        var = (self.total_sq - self.total**2 / self.pulls) / (self.pulls - 1)
        return math.sqrt(max(var, 0.0))

    def add(self, reward: float) -> None:
        self.pulls += 1
        self.total += reward
        self.total_sq += reward * reward


class BanditPulls:
    """The pull log of bandits in a Store's database (table ``proftune_bandit_pulls``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        _metadata.create_all(store.engine)

    def record(self, bandit: str, arm: str, reward: float, *, policy: str, run_id: int | None = None) -> None:
        now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
        with self.store.engine.begin() as conn:
            conn.execute(pulls_table.insert().values(bandit=bandit, arm=arm, reward=float(reward),
                                                     policy=policy, run_id=run_id, created_at=now))

    def history(self, bandit: str) -> list[tuple[str, float]]:
        """``(arm, reward)`` of every pull of ``bandit``, oldest first."""
        stmt = (sa.select(pulls_table.c.arm, pulls_table.c.reward)
                .where(pulls_table.c.bandit == bandit).order_by(pulls_table.c.id))
        with self.store.engine.connect() as conn:
            return [(r.arm, float(r.reward)) for r in conn.execute(stmt)]


def bandit_key(arms: Sequence[Arm], prefix: str = "") -> str:
    """A stable name for a set of arms (so a rerun with the same configs continues)."""
    blob = json_dumps([[a.name, a.params] for a in arms], sort_keys=True)
    return f"{prefix}{hashlib.sha1(blob.encode()).hexdigest()[:12]}"


class Bandit:
    """Allocates pulls across ``arms`` with ``policy``; with a ``store``, state persists there.

    ``name`` identifies the bandit in the store (default: the task prefix and a hash of the arms).
    ``ucb_c`` scales UCB's exploration bonus; ``prior_std`` is the reward spread assumed before
    two pulls of any arm exist.
    """

    def __init__(self, arms: Sequence[Arm], *, policy: str = "thompson", name: str | None = None,
                 store: Store | None = None, seed: int = 0, ucb_c: float = 1.0,
                 prior_std: float | None = None) -> None:
        problems = ProblemCollector()
        if policy not in POLICIES:
            problems.add(f"policy={policy!r} is unknown; valid: {', '.join(POLICIES)}.")
        if len(arms) < 2:
            problems.add(f"a bandit needs at least 2 configurations, but got {len(arms)}.")
        names = [a.name for a in arms]
        if len(set(names)) != len(names):
            problems.add(f"configuration names must be unique, but got {names}.")
        if ucb_c <= 0:
            problems.add(f"ucb_c must be > 0, but got {ucb_c=}.")
        problems.raise_if_any()
        self.arms = list(arms)
        self.policy, self.ucb_c, self.prior_std = policy, ucb_c, prior_std
        self.name = name or bandit_key(self.arms)
        self.rng = random.Random(seed)
        self.log = BanditPulls(store) if store is not None else None
        self.stats = {a.name: ArmStats(a.name) for a in self.arms}
        self.history: list[tuple[str, float]] = []
        if self.log is not None:
            for arm, reward in self.log.history(self.name):
                if arm in self.stats:
                    self._add(arm, reward)

    def _add(self, arm: str, reward: float) -> None:
        self.stats[arm].add(reward)
        self.history.append((arm, reward))

    @property
    def t(self) -> int:
        """Pulls so far (this and earlier processes)."""
        return len(self.history)

    def _pooled_std(self) -> float:
        num = den = 0.0
        for s in self.stats.values():
            if s.pulls >= 2:
                num += (s.pulls - 1) * s.std**2
                den += s.pulls - 1
        if den >= 2:
            return max(math.sqrt(num / den), 1e-9)
        if self.prior_std is not None:
            return self.prior_std
        # too few repeats to estimate the noise: assume it spans the rewards seen so far
        rewards = [r for _, r in self.history]
        spread = (max(rewards) - min(rewards)) if len(rewards) >= 2 else 0.0
        level = abs(statistics.fmean(rewards)) * 0.1 if rewards else 1.0
        return max(spread, level, 1e-6)

    def select(self) -> Arm:
        """The arm to pull next."""
        unpulled = [a for a in self.arms if self.stats[a.name].pulls == 0]
        if unpulled:
            return unpulled[0]
        if self.policy == "uniform":
            return self.arms[self.t % len(self.arms)]
        s = self._pooled_std()
        if self.policy == "thompson":
            scores = {a.name: self.rng.gauss(self.stats[a.name].mean, s / math.sqrt(self.stats[a.name].pulls))
                      for a in self.arms}
        else:
            log_t = math.log(max(self.t, 2))
            scores = {a.name: self.stats[a.name].mean
                      + self.ucb_c * s * math.sqrt(2 * log_t / self.stats[a.name].pulls) for a in self.arms}
        best = max(scores.values())
        return next(a for a in self.arms if scores[a.name] == best)

    def update(self, arm: Arm | str, reward: float, *, run_id: int | None = None) -> None:
        """Record the reward of one pull (in the store too, when there is one)."""
        name = arm.name if isinstance(arm, Arm) else arm
        if name not in self.stats:
            raise ConfigError(f"arm={name!r} is not a configuration of this bandit; valid: {', '.join(self.stats)}.")
        if not math.isfinite(reward):
            raise ConfigError(f"reward must be finite, but got {reward=} for arm {name!r}.")
        self._add(name, float(reward))
        if self.log is not None:
            self.log.record(self.name, name, float(reward), policy=self.policy, run_id=run_id)

    def best(self) -> str:
        """The arm with the highest mean reward so far."""
        pulled = [s for s in self.stats.values() if s.pulls]
        if not pulled:
            return self.arms[0].name
        return max(pulled, key=lambda s: s.mean).name

    def allocation(self) -> dict[str, int]:
        return {a.name: self.stats[a.name].pulls for a in self.arms}


def regret_curve(history: Sequence[tuple[str, float]], means: dict[str, float]) -> list[float]:
    """Cumulative regret after each pull: ``sum(max(means) - means[arm])``."""
    top = max(means.values())
    out, total = [], 0.0
    for arm, _ in history:
        total += top - means.get(arm, top)
        out.append(total)
    return out


@dataclass
class SimResult:
    """A simulated run of a policy on arms with known mean rewards."""

    policy: str
    history: list[tuple[str, float]]
    regret: list[float]
    best_share_last_half: float
    allocation: dict[str, int]


def simulate(means: Sequence[float], *, rounds: int, policy: str = "thompson", noise: float = 0.05,
             seed: int = 0, store: Store | None = None, name: str | None = None,
             sampler: Callable[[random.Random, float], float] | None = None) -> SimResult:
    """Run ``policy`` for ``rounds`` pulls on arms whose reward is ``N(mean, noise**2)``."""
    if rounds < 1:
        raise ConfigError(f"rounds must be at least 1, but got {rounds=}.")
    arms = [Arm(f"config-{i}", {"mean": m}) for i, m in enumerate(means)]
    bandit = Bandit(arms, policy=policy, seed=seed, store=store, name=name)
    rng = random.Random(seed + 1)
    draw = sampler or (lambda r, m: r.gauss(m, noise))
    true = {a.name: float(m) for a, m in zip(arms, means, strict=True)}
    for _ in range(rounds):
        arm = bandit.select()
        bandit.update(arm, draw(rng, true[arm.name]))
    best = max(true, key=true.__getitem__)
    tail = bandit.history[len(bandit.history) // 2:]
    share = sum(1 for a, _ in tail if a == best) / max(len(tail), 1)
    return SimResult(policy, bandit.history, regret_curve(bandit.history, true), share, bandit.allocation())
