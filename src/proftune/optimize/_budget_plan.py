"""The budget planned before the search: what the time holds at the task's own protocol.

The reference of every decision is the task's defaults trained at their own epochs. So the plan
starts from one measured full training of the defaults and sets aside, before the search gets
anything, what the final race needs to decide at that protocol: enough paired seeds of the
defaults and the search's finalists (a power calculation from the seeds' spread, the gain worth
finding and the validation set's resolution). The search gets the rest, at a lower fidelity
(fewer epochs) where the rest cannot hold several full trainings; its finalists are promoted to
the full protocol in the race. Where the budget cannot hold the race at all, the plan says so at
once, with the smallest budget that can, and the loop returns the defaults with the search's
proposals, not adopted. The plan is made again from measured times before each stage that
depends on it (a machine under load is normal).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from .._records import JsonRecord

__all__ = ["BudgetPlan", "paired_seeds_needed", "plan_budget", "rankable_epoch"]

#: Power of the race's test for the gain worth finding (the chance to detect it when it is there).
POWER = 0.8
#: The race trains at least this many finalists beside the defaults.
MIN_FINALISTS = 1
#: The search gets at least this many trials where the race fits, else none is worth it: the
#: computed centre and one step of its local design (on a loaded machine, at 8 trainings, four
#: left no time for the race, and the defaults were kept where the centre alone was far better).
MIN_SEARCH_TRIALS = 2
#: The race's planned seeds take at most this share of the time left (after what follows it), down
#: to one seed: at a few trainings the search's trials are worth more than the race's power (its
#: further rounds still use what the search leaves). On generated tasks at 8 trainings, three planned
#: seeds left the search 3 trials where a plain loop ran 8-10, and the race then confirmed a centre
#: worse than the defaults over 4 rounds.
RACE_SHARE_MAX = 0.4
#: Below this many seconds the compress stage is skipped (imports + one pruned and one INT8
#: candidate measured as saved take ~20-30 s on 2 shared cores).
MIN_COMPRESS_S = 15.0
#: What the search keeps back for the compress stage (measured: 25-50 s for one structured ratio
#: and INT8 on digits-cnn on 2 shared cores, imports included).
COMPRESS_RESERVE_S = 40.0
#: The search prunes by successive halving when its time holds fewer full trials than this.
FULL_TRIALS_FOR_NO_PRUNER = 15.0
#: Candidates the search's time is planned to leave room for (the race takes more if it can).
RESERVED_CANDIDATES = 2
#: Seeds per arm at most, when the time left holds more than ``--seeds`` (a sharper comparison).
MAX_ROUNDS = 10
#: Seconds one run costs beyond its epochs (the run record, the held-out evaluation, the save).
RUN_OVERHEAD_S = 0.3
#: Trials run at the task's own epochs when the search's time holds at least this many of them
#: (successive halving still stops the weak early): a trial at the own epochs is then the race's
#: first run of the search's best (its model kept), where a shorter one must be trained again.
FULL_TRIALS_AT_LEAST = 3.0


def _z(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def paired_seeds_needed(*, seed_std: float | None, gain: float | None, resolution: float,
                        alpha: float, low: int, high: int) -> int:
    """Paired seeds for a one-sided test at ``alpha`` to detect ``gain`` with power ``POWER``.

    The per-seed difference of two independent trainings has a standard deviation of about
    ``sqrt(2) * seed_std``; the gain to detect is at least the metric's ``resolution``.
    Student's t needs about one pair more than the normal approximation. Bounded to
    ``[low, high]``; unknown spread or gain: ``low``."""
    if seed_std is None or not math.isfinite(seed_std) or seed_std <= 0:
        return low
    delta = max(abs(gain) if gain is not None and math.isfinite(gain) else 0.0, resolution)
    if delta <= 0:
        return high
    n = ((_z(1.0 - alpha) + _z(POWER)) * math.sqrt(2.0) * seed_std / delta) ** 2 + 1.0
    return int(min(high, max(low, math.ceil(n))))


@dataclass(frozen=True)
class BudgetPlan(JsonRecord):
    """How the seconds left are spent, from the measured time of one full training."""

    WHAT: ClassVar[str] = "a budget plan"

    #: The task's own epochs (the protocol the defaults are judged by).
    full_epochs: int
    #: Seconds of one training of the defaults at ``full_epochs`` (measured epoch time).
    full_s: float
    #: Seconds left when the plan was made (the whole budget's, less what is spent).
    left_s: float
    #: How many full trainings the seconds left hold.
    full_trainings: float
    #: Paired seeds the race plans for (power calculation, at least ``--seeds``; fewer, down to one,
    #: where the time left holds no more: ``seeds_wanted`` were asked for).
    seeds: int
    #: Finalists of the search promoted to the full protocol beside the defaults.
    finalists: int
    #: Seconds set aside for the race (``seeds`` x (1 + ``finalists``) full trainings, less those done).
    race_s: float
    #: Seconds kept for compression and the outputs.
    after_s: float
    #: Seconds the search gets.
    search_s: float
    #: Epochs of a search trial (the low fidelity; the full protocol when the time holds it).
    trial_epochs: int
    #: Whether the race at the full protocol fits (else: the defaults are the result).
    race_fits: bool
    #: The smallest ``--budget`` (s) whose race at the full protocol fits.
    min_budget_s: float
    #: The whole budget (s).
    budget_s: float
    #: The paired seeds the power calculation (or ``--seeds``) asked for (0: as ``seeds``).
    seeds_wanted: int = 0

    def describe(self) -> str:
        """The plan in one sentence a user reads at the start."""
        head = (f"one training of the defaults at their own {self.full_epochs} epochs takes ~{self.full_s:.0f} s "
                f"here; the {self.left_s:.0f} s left hold {self.full_trainings:.1f} such trainings")
        if not self.race_fits:
            return (f"{head}: too few to compare a configuration with the defaults at their own protocol "
                    f"({'even one paired seed' if self.seeds_wanted > 1 else f'{self.seeds} paired seed(s)'} of the "
                    f"defaults and {self.finalists} finalist(s) need "
                    f"~{self.race_s:.0f} s), so the search's best races them only in the time the search "
                    "leaves, where a gain far beyond the seeds' noise replaces them; else the defaults are the "
                    f"result and the search's best are proposals, not adopted; comparing at their own "
                    f"{self.full_epochs} epochs needs --budget >= {_duration(self.min_budget_s)}")
        fidelity = (f"trials at the full {self.full_epochs} epochs" if self.trial_epochs >= self.full_epochs
                    else f"trials at {self.trial_epochs} of {self.full_epochs} epochs (low fidelity, for ranking)")
        fewer = (f" (of the {self.seeds_wanted} asked for: the time holds no more, so only a gain beyond the seeds' "
                 "noise at that count can replace the defaults)" if 0 < self.seeds < self.seeds_wanted else "")
        return (f"{head}: the search gets ~{self.search_s:.0f} s ({fidelity}); its best {self.finalists} "
                f"then race the defaults at the full {self.full_epochs} epochs over {self.seeds} paired "
                f"seed{'' if self.seeds == 1 else 's'}{fewer} (~{self.race_s:.0f} s set aside)")


def _duration(seconds: float) -> str:
    minutes = seconds / 60.0
    return f"{math.ceil(minutes)}m" if seconds >= 120 else f"{math.ceil(seconds)}s"


def plan_budget(*, full_epochs: int, epoch_s: float, run_overhead_s: float, left_s: float,
                spent_s: float, budget_s: float, after_s: float, seeds: int, finalists: int,
                trial_epochs: int, search_done: bool = False,
                done_runs: int = 0) -> BudgetPlan:
    """The plan for ``left_s`` seconds: the race at ``seeds`` paired seeds of the defaults and
    ``finalists`` finalists at ``full_epochs``, ``after_s`` for what follows, the search the rest.

    ``trial_epochs``: the fidelity the caller would give a trial in the search's seconds (the
    plan checks that the search holds a few trials of it). A race that does not fit with fewer
    finalists (down to one) does not fit at all.

    ``done_runs``: the race's trainings already done (the baseline's training of the defaults at
    their own protocol is the defaults' first seed: 1), which the race does not pay again."""
    full_s = full_epochs * max(epoch_s, 1e-4) + run_overhead_s
    trial_s = max(trial_epochs, 1) * max(epoch_s, 1e-4) + run_overhead_s
    min_search = 0.0 if search_done else MIN_SEARCH_TRIALS * trial_s
    finalists = max(MIN_FINALISTS, finalists)

    def race(k: int, n: int = seeds) -> float:
        return 1.1 * max(0, n * (1 + k) - done_runs) * full_s

    while finalists > MIN_FINALISTS and race(finalists) + after_s + min_search > left_s:
        finalists -= 1
    # where ``seeds`` paired seeds do not fit, fewer do, down to one: with the seeds' noise known
    # (the search's repeats, the validation set's sampling noise) one pair still decides a gain far
    # beyond it, and nothing less (a plateau start the defaults never leave is such a gain)
    n = seeds
    while n > 1 and (race(finalists, n) + after_s + min_search > left_s
                     or race(finalists, n) > RACE_SHARE_MAX * (left_s - after_s)):
        n -= 1
    race_s = race(finalists, n)
    fits = race_s + after_s + min_search <= left_s
    # the smallest budget: what is spent, a one-seed race with one finalist, a minimal search, what follows
    min_budget = spent_s + race(MIN_FINALISTS, 1) + MIN_SEARCH_TRIALS * trial_s + after_s
    search_s = max(0.0, left_s - after_s - (race_s if fits else 0.0))
    return BudgetPlan(full_epochs=full_epochs, full_s=full_s, left_s=left_s,
                      full_trainings=left_s / full_s if full_s > 0 else math.inf, seeds=n,
                      seeds_wanted=seeds,
                      finalists=finalists, race_s=race_s, after_s=after_s, search_s=search_s,
                      trial_epochs=trial_epochs, race_fits=fits, min_budget_s=min_budget,
                      budget_s=budget_s)


def rankable_epoch(start: float | None, curve: Sequence[float | None], *, maximize: bool,
                   val_samples: int | None) -> int | None:
    """The first epoch at which the defaults' own curve had separated from its start: half of its
    final gain over the untrained model, and beyond the validation set's resolution (two samples of
    it, or 2% of the start's magnitude). A trial stopped or compared before then is ranked by the
    noise of a curve still at its start (a plateau, a slow starter), so no rung of the search is
    placed there. None: the curve never separated (no epoch ranks; nothing is pruned by epoch)."""
    values = [v for v in curve if v is not None and math.isfinite(v)]
    if start is None or not math.isfinite(start) or not values or len(values) != len(curve):
        return None
    sign = 1.0 if maximize else -1.0
    gains = [sign * (v - start) for v in values]
    tol = max(2.0 / val_samples if val_samples else 0.0, 0.02 * abs(start), 1e-12)
    final = gains[-1]
    if final <= tol:
        return None
    return next(i + 1 for i, g in enumerate(gains) if g >= 0.5 * final and g > tol)
