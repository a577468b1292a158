"""Is a configuration better than the defaults beyond noise? A paired comparison over seeds.

Both configurations are trained with the same seeds under one protocol; the per-seed differences
``d_i`` (sign-adjusted so that positive is better) are what the seeds' noise leaves of the gain.
The choice is kept only when the one-sided lower confidence bound of the mean difference
(Student's t over the pairs, level ``1 - alpha``) is above zero and the mean gain is at least the
metric's resolution (one sample of the validation data for a ratio such as accuracy). The race
adds a rank-sum test against every unselected training of the defaults where their seeds spread
too widely for the t-test (:func:`compare_race`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import ClassVar, TypedDict

from .._jsonsafe import finite_float
from .._records import JsonRecord

__all__ = ["ALPHA", "SAMPLING_TO_SEED", "SCHEMA_VERSION", "Comparison", "ahead_within_noise", "compare_paired",
           "compare_race", "lead_in_search", "metric_resolution", "pooled_seed_std", "prior_seed_std", "rank_sum_p",
           "sampling_std", "winners_curse"]

SCHEMA_VERSION = 1
#: One-sided error rate of "beyond noise" (before dividing among several candidates).
ALPHA = 0.05


def _t_within(t: float, df: int) -> float:
    """P(|T| <= t), T Student's t at ``df`` (a positive integer) degrees of freedom: the finite
    series of Abramowitz & Stegun 26.7.3 (odd ``df``) and 26.7.4 (even)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        if df == 1:
            return 2.0 * theta / math.pi
        term = total = 1.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2.0 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term = total = 1.0
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def _t_quantile(level: float, df: int) -> float:
    """Student's t quantile at ``level`` (0 < level < 1) and ``df`` degrees of freedom, by
    bisection on :func:`_t_within`: scipy's ``stats`` took 1-5 s to import inside the budget of a
    run whose trainings take a second (a plain Optuna loop imports none of it)."""
    if level < 0.5:
        return -_t_quantile(1.0 - level, df)
    target = 2.0 * level - 1.0
    lo, hi = 0.0, 1.0
    while _t_within(hi, df) < target:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if _t_within(mid, df) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


class ComparisonExtra(TypedDict, total=False):
    """What a comparison holds beside the paired test: the defaults' trainings outside the race, the
    rank-sum test over all of them, the margin and the search's lead a race decision read."""

    defaults_outside_race: int
    rank_p: float
    rank_alpha: float
    gain_all: float
    defaults_all: list[float]
    margin: float
    search_lead: float


@dataclass(frozen=True)
class Comparison(JsonRecord):
    """A paired comparison of ``chosen`` against ``defaults`` on one metric and one data split."""

    WHAT: ClassVar[str] = "a paired comparison"
    SCHEMA: ClassVar[int | None] = SCHEMA_VERSION

    metric: str
    maximize: bool
    split: str  # "val" or "test"
    seeds: list[int]
    chosen: list[float]
    defaults: list[float]
    #: Mean and standard deviation of the per-seed gains (positive: the choice is better).
    gain: float | None
    gain_std: float | None
    #: One-sided lower bound of the mean gain at ``level`` (None with fewer than 2 pairs).
    lower: float | None
    level: float
    resolution: float
    beyond_noise: bool
    reason: str
    schema_version: int = SCHEMA_VERSION
    extra: ComparisonExtra = field(default_factory=ComparisonExtra)

    def describe(self) -> str:
        """One line: the gain with its noise and what it means."""
        if self.gain is None:
            return self.reason
        std = f" ± {self.gain_std:.4g}" if self.gain_std is not None else ""
        more = int(self.extra.get("defaults_outside_race", 0))
        over = f"{len(self.seeds)} paired seed(s)" + (f" and {more} more training(s) of the defaults" if more else "")
        return f"{self.metric} gain {self.gain:+.4g}{std} over {over} on {self.split}: {self.reason}"


def compare_paired(chosen: Sequence[float | None], defaults: Sequence[float | None], *, seeds: Sequence[int],
                   metric: str, maximize: bool, split: str = "val", resolution: float = 0.0,
                   alpha: float = ALPHA, prior_std: float | None = None,
                   defaults_more: Sequence[float | None] = ()) -> Comparison:
    """Compare per-seed values of the choice and the defaults (index ``i`` of each: seed ``i``).

    Pairs where either value is missing or not finite are left out. ``prior_std``: the seeds'
    standard deviation known from elsewhere (the search's repeats), used when one pair is all
    there is. ``alpha`` is one-sided. ``defaults_more``: the defaults' values from unselected
    trainings outside the pairs; where the known noise decides (one or two pairs), the gain is
    the choice's mean against the mean of every training of the defaults, its noise that of the
    two means (a baseline and a search evaluation of the defaults halve their part of it).
    """
    sign = 1.0 if maximize else -1.0
    pairs = [(s, fc, fd) for s, c, d in zip(seeds, chosen, defaults, strict=False)
             if (fc := finite_float(c)) is not None and (fd := finite_float(d)) is not None]
    level = 1.0 - alpha
    made = partial(Comparison, metric=metric, maximize=maximize, split=split, seeds=[p[0] for p in pairs],
                   chosen=[p[1] for p in pairs], defaults=[p[2] for p in pairs], level=level, resolution=resolution)
    if not pairs:
        return made(gain=None, gain_std=None, lower=None, beyond_noise=False,
                    reason="no seed produced a finite value for both configurations")
    gains = [sign * (c - d) for _, c, d in pairs]
    mean = statistics.fmean(gains)
    n = len(gains)
    std = statistics.stdev(gains) if n > 1 else None
    test = "a paired t-test over the seeds"
    within = n <= 2 or (std is not None and prior_std is not None and std <= prior_std * math.sqrt(2.0))
    if prior_std is not None and prior_std > 0 and within:
        # the seeds' noise known (the search's spread, the validation set's sampling noise): a
        # normal bound at that noise; the difference of two seeds has the seeds' variance twice.
        # One or two pairs: with their own spread where it is larger (a t-test at one degree of
        # freedom needs a gain 25x its spread: a race cut to two seeds by the time could not pass).
        # Three or more: while their own spread is within the known noise (a t-test at two degrees
        # of freedom needs 6x its spread at the race's level, so a third seed made the bound wider
        # than two seeds' had been: noisy labels, +0.04 on 300 samples kept as noise); where it is
        # larger (defaults that diverge on some seeds), the t-test on their own spread decides
        more = [fm for m in defaults_more if (fm := finite_float(m)) is not None] if n <= 2 else []
        d_all = [p[2] for p in pairs] + more
        # the defaults' own trainings spread wider than the known noise (a rate that diverges on some
        # seeds): their spread is the noise of their mean
        d_sd = max(prior_std, statistics.stdev(d_all)) if len(d_all) >= 3 else prior_std
        if more:
            mean = sign * (statistics.fmean(p[1] for p in pairs) - statistics.fmean(d_all))
            sd_mean = math.sqrt(max(std or 0.0, prior_std) ** 2 / n + d_sd ** 2 / len(d_all))
        else:
            sd_mean = max(std or 0.0, prior_std * math.sqrt(2.0)) / math.sqrt(n)
        lower = mean - statistics.NormalDist().inv_cdf(level) * sd_mean
        many = f"{n} paired seeds (their spread {std:.3g} within it)" if n > 2 and std is not None else ""
        test = (f"{many or ('one paired seed' if n == 1 else 'two paired seeds')}"
                + (f" and {len(more)} more training(s) of the defaults" if more else "")
                + f" against the seeds' noise, std {prior_std:.3g}")
    elif n > 1:
        assert std is not None
        lower = mean - _t_quantile(level, n - 1) * std / math.sqrt(n) if std > 0 else mean
    else:
        lower = None
    if lower is None:
        beyond, why = False, "one seed cannot separate a gain from the seeds' noise"
    elif mean < resolution:
        beyond, why = False, (f"the mean gain {mean:+.4g} is below the metric's resolution {resolution:.4g}"
                              if mean > 0 else f"the mean gain {mean:+.4g} is not a gain")
    else:
        beyond = lower > 0
        why = (f"beyond noise: the {level:.0%} lower bound of the gain is {lower:+.4g} > 0 ({test})" if beyond
               else f"within noise: the {level:.0%} lower bound of the gain is {lower:+.4g} ({test})")
    return made(gain=mean, gain_std=std, lower=lower, beyond_noise=beyond, reason=why)


def rank_sum_p(chosen: Sequence[float], defaults: Sequence[float], *, maximize: bool) -> float:
    """One-sided exact p-value of the Wilcoxon rank-sum (Mann-Whitney) test that ``chosen`` is
    better than ``defaults``: the share of the ways to pick ``len(chosen)`` of all the runs whose
    rank sum is at least the choice's (mid-ranks for ties; counted exactly, no approximation)."""
    sign = 1.0 if maximize else -1.0
    values = sorted((sign * v, i < len(chosen)) for i, v in enumerate([*chosen, *defaults]))
    # twice the mid-rank of each value, so that every rank is an integer
    ranks: list[tuple[int, bool]] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1][0] == values[i][0]:
            j += 1
        ranks.extend((i + j + 2, values[k][1]) for k in range(i, j + 1))
        i = j + 1
    n = len(chosen)
    observed = sum(r for r, is_chosen in ranks if is_chosen)
    # ways[k][s]: subsets of k of the runs seen so far whose doubled rank sum is s
    ways: list[dict[int, int]] = [{0: 1}] + [{} for _ in range(n)]
    for r, _ in ranks:
        for k in range(n, 0, -1):
            for s, c in ways[k - 1].items():
                ways[k][s + r] = ways[k].get(s + r, 0) + c
    total = sum(ways[n].values())
    return sum(c for s, c in ways[n].items() if s >= observed) / total if total else 1.0


def compare_race(chosen: Sequence[float | None], defaults: Sequence[float | None], *, seeds: Sequence[int],
                 defaults_more: Sequence[float | None] = (), metric: str, maximize: bool, split: str = "val",
                 resolution: float = 0.0, alpha: float = ALPHA, prior_std: float | None = None) -> Comparison:
    """The race's decision: :func:`compare_paired` over the seeds, and beside it a rank-sum test
    (:func:`rank_sum_p`) of the choice's runs against every unselected training of the defaults,
    the race's and ``defaults_more`` (their trainings at the same protocol outside the race: the
    search's evaluations of them, which nothing selected).

    The paired t-test loses its power where the defaults' seeds spread many times the choice's (a
    rate that diverges on some seeds: 0.47, 0.85, 0.90, 0.53 against 0.95, 0.93, 0.92, 0.95 bounds
    the gain at -0.02); ranks do not weigh how far a diverged seed fell. Each test runs at
    ``alpha / 2`` (Bonferroni), except where the rank test cannot reach that level with the runs
    there are (its smallest p-value, one over the ways to pick the choice's runs, is above it):
    then the paired test alone decides, at ``alpha``. A rank test's verdict also needs the mean
    gain over all the runs to be a gain the data can show (``resolution``)."""
    c_vals = [fc for c in chosen if (fc := finite_float(c)) is not None]
    d_race = [fd for d in defaults if (fd := finite_float(d)) is not None]
    d_more = [fd for d in defaults_more if (fd := finite_float(d)) is not None]
    d_all = d_race + d_more
    extra = ComparisonExtra(defaults_outside_race=len(d_more))
    can_rank = len(c_vals) >= 2 and len(d_all) >= 2 and 1.0 / math.comb(len(c_vals) + len(d_all),
                                                                           len(c_vals)) <= alpha / 2
    if not can_rank:
        paired = compare_paired(chosen, defaults, seeds=seeds, metric=metric, maximize=maximize, split=split,
                                resolution=resolution, alpha=alpha, prior_std=prior_std, defaults_more=d_more)
        return dataclasses.replace(paired, extra={**paired.extra, **extra})
    paired = compare_paired(chosen, defaults, seeds=seeds, metric=metric, maximize=maximize, split=split,
                            resolution=resolution, alpha=alpha / 2, prior_std=prior_std)
    p = rank_sum_p(c_vals, d_all, maximize=maximize)
    sign = 1.0 if maximize else -1.0
    gain_all = sign * (statistics.fmean(c_vals) - statistics.fmean(d_all))
    extra.update({"rank_p": p, "rank_alpha": alpha / 2, "gain_all": gain_all, "defaults_all": d_all})
    ranked = (f"a rank-sum test of the choice's {len(c_vals)} runs against the defaults' {len(d_all)} trainings"
              + (f" ({len(d_more)} outside the race)" if d_more else "")
              + f": one-sided p = {p:.3g}, at {alpha / 2:.3g}")
    if paired.beyond_noise:
        return dataclasses.replace(paired, extra={**paired.extra, **extra})
    if p <= alpha / 2 and gain_all >= max(resolution, 1e-12) and (paired.gain is None or paired.gain > 0):
        d_std = statistics.stdev(d_all)
        why = (f"beyond noise by ranks: {ranked}; the defaults' trainings spread by {d_std:.3g}, so the paired "
               f"t-test's bound is wide ({paired.reason})")
        return dataclasses.replace(paired, beyond_noise=True, reason=why, extra={**paired.extra, **extra})
    return dataclasses.replace(paired, reason=f"{paired.reason}; not by ranks either ({ranked})",
                               extra={**paired.extra, **extra})


def pooled_seed_std(groups: Iterable[tuple[float | None, int]]) -> float | None:
    """The seeds' standard deviation pooled over configurations measured at two seeds or more
    (``(s, k)`` each: a std over ``k`` seeds): sqrt(sum (k-1) s^2 / sum (k-1)); None without such a group."""
    num = den = 0.0
    for std, n in groups:
        if n >= 2 and isinstance(std, (int, float)) and math.isfinite(std):
            num += (n - 1) * float(std) ** 2
            den += n - 1
    return math.sqrt(num / den) if den else None


#: A seed moves a model's validation ratio by about the validation data's binomial noise (init
#: and data order on one fixed validation set): where no seed spread was measured, one seed's noise
#: is taken as 1.25x the binomial standard deviation. Measured on ten generated tasks (seed 9100,
#: five seeds of the defaults each): 0.2x to 3x, median 1.2x (the widest where the defaults
#: diverge on some seeds, which their own spread or the race's rank test then shows). At 2x, one
#: paired seed needed a gain of 4.7 binomial deviations to count, and the race kept the defaults on
#: most generated tasks at 8 trainings where a plain loop's best was ahead.
SAMPLING_TO_SEED = 1.25


def prior_seed_std(measured: float | None, *, metric: str, val_samples: int | None,
                   level: float | None) -> float | None:
    """The seeds' noise a one-seed comparison is judged against: ``measured`` (the search's
    pooled spread over seeds) where there is one, never below the validation set's own sampling
    noise; else, for a ratio metric (accuracy), ``SAMPLING_TO_SEED`` x sqrt(p (1 - p) / n) at
    the defaults' level ``p`` on ``n`` validation samples; else None (one seed decides nothing)."""
    from ..metrics import METRICS

    m = METRICS.get(metric)
    binomial = None
    if m is not None and m.unit == "ratio" and val_samples:
        p = min(max(level if level is not None else 0.5, 0.05), 0.95)
        binomial = math.sqrt(p * (1 - p) / val_samples)
    if measured is not None and measured > 0:
        return max(measured, binomial or 0.0)
    return SAMPLING_TO_SEED * binomial if binomial is not None else None


def ahead_within_noise(comparison: Comparison, *, margin: float | None) -> bool:
    """Whether a choice the comparison leaves within noise still replaces the defaults: its mean
    gain is a gain the data can show (at least the resolution) and the same one-sided bound that
    did not clear zero clears ``-margin``, one validation figure's sampling noise at the defaults'
    level: it is ahead on every measurement there is, and a loss beyond the noise of one figure
    is ruled out at the comparison's level. ``margin`` None (a loss, a custom metric): never.

    The bar the loop is judged by is the defaults (never below them beyond noise) and a plain
    loop that adopts its best on validation (at 8 trainings on generated tasks, the strict rule
    kept the defaults on most tasks where that loop's best was ahead by 2-16 points)."""
    if margin is None or margin <= 0 or comparison.gain is None or comparison.lower is None:
        return False
    return comparison.gain >= max(comparison.resolution, 1e-12) and comparison.lower > -margin


def lead_in_search(candidate: float | None, defaults: float | None, maximize: bool) -> float | None:
    """How far a candidate's mean in the search is ahead of the defaults' there (same protocol,
    same validation data), in the better direction; None where either was not measured."""
    if candidate is None or defaults is None or not math.isfinite(candidate) or not math.isfinite(defaults):
        return None
    return (candidate - defaults) * (1.0 if maximize else -1.0)


def metric_resolution(metric: str, val_samples: int | None) -> float:
    """The smallest change of ``metric`` the validation data can show: one sample of a ratio."""
    from ..metrics import METRICS

    m = METRICS.get(metric)
    if m is not None and m.unit == "ratio" and val_samples:
        return 1.0 / val_samples
    return 0.0


def sampling_std(metric: str, val_samples: int | None, level: float | None) -> float | None:
    """The noise of one validation figure of ``metric`` at ``level``: binomial for a ratio metric
    on ``val_samples`` samples; None where it is not known."""
    from ..metrics import METRICS

    m = METRICS.get(metric)
    if m is None or m.unit != "ratio" or not val_samples or level is None or not 0.0 <= level <= 1.0:
        return None
    return math.sqrt(max(level * (1.0 - level), 0.25 / val_samples) / val_samples)


def winners_curse(metric: str, val_samples: int | None, level: float | None, compared: int) -> float:
    """How much the best of ``compared`` draws on one validation set is inflated: one figure's
    sampling noise there times sqrt(2 ln compared) (0 where the noise is not known, or one draw)."""
    noise = sampling_std(metric, val_samples, level)
    return noise * math.sqrt(2.0 * math.log(compared)) if noise is not None and compared > 1 else 0.0
