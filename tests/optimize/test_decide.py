"""The paired comparison that decides whether a configuration replaces the defaults."""

from __future__ import annotations

import math

import numpy as np
import pytest

from proftune.optimize._decide import (
    Comparison,
    _t_quantile,
    compare_paired,
    compare_race,
    pooled_seed_std,
    prior_seed_std,
    rank_sum_p,
)


def test_a_consistent_gain_over_seeds_is_beyond_noise() -> None:
    c = compare_paired([0.90, 0.91, 0.92], [0.80, 0.82, 0.81], seeds=[1, 2, 3], metric="accuracy",
                       maximize=True, resolution=1 / 300)
    assert c.beyond_noise
    assert c.gain == pytest.approx(0.1, abs=1e-9)
    assert c.lower is not None
    assert 0 < c.lower < c.gain
    assert "beyond noise" in c.reason


def test_a_gain_a_third_of_its_spread_is_within_noise() -> None:
    # the README's run on main: 0.9935 +- 0.0058 against 0.9917 (a third of one std)
    chosen, defaults = [0.9917, 0.9989, 0.9900], [0.9917, 0.9917, 0.9917]
    c = compare_paired(chosen, defaults, seeds=[0, 1, 2], metric="accuracy", maximize=True)
    assert not c.beyond_noise
    assert c.gain is not None
    assert c.gain > 0
    assert "within noise" in c.reason


def test_a_gain_below_one_sample_is_not_a_gain_the_data_can_show() -> None:
    c = compare_paired([0.501, 0.502, 0.501], [0.5, 0.5, 0.5], seeds=[0, 1, 2], metric="accuracy",
                       maximize=True, resolution=0.01)
    assert not c.beyond_noise
    assert "resolution" in c.reason


def test_direction_of_a_metric_to_minimise() -> None:
    c = compare_paired([0.20, 0.21, 0.19], [0.40, 0.42, 0.41], seeds=[0, 1, 2], metric="val_loss",
                       maximize=False)
    assert c.beyond_noise
    assert c.gain == pytest.approx(0.21, abs=1e-9)
    worse = compare_paired([0.40, 0.42, 0.41], [0.20, 0.21, 0.19], seeds=[0, 1, 2], metric="val_loss",
                           maximize=False)
    assert not worse.beyond_noise
    assert worse.gain is not None
    assert worse.gain < 0


def test_one_seed_needs_a_known_seed_spread() -> None:
    alone = compare_paired([0.9], [0.8], seeds=[0], metric="accuracy", maximize=True)
    assert not alone.beyond_noise
    assert "one seed" in alone.reason
    known = compare_paired([0.9], [0.8], seeds=[0], metric="accuracy", maximize=True, prior_std=0.01)
    assert known.beyond_noise
    noisy = compare_paired([0.9], [0.8], seeds=[0], metric="accuracy", maximize=True, prior_std=0.2)
    assert not noisy.beyond_noise


def test_pairs_with_a_missing_or_nan_value_are_left_out() -> None:
    c = compare_paired([0.9, None, float("nan"), 0.91], [0.8, 0.8, 0.8, 0.82], seeds=[0, 1, 2, 3],
                       metric="accuracy", maximize=True)
    assert c.seeds == [0, 3]
    none = compare_paired([None], [0.8], seeds=[0], metric="accuracy", maximize=True)
    assert none.gain is None
    assert not none.beyond_noise


def test_false_choices_are_rare_when_nothing_differs() -> None:
    """Two equal configurations: the rule keeps the defaults in about 95% of draws (alpha 0.05)."""
    rng = np.random.default_rng(0)
    chosen = 0
    for _ in range(2000):
        a = 0.9 + rng.normal(0, 0.01, 5)
        b = 0.9 + rng.normal(0, 0.01, 5)
        chosen += compare_paired(list(a), list(b), seeds=list(range(5)), metric="accuracy",
                                 maximize=True).beyond_noise
    assert chosen / 2000 < 0.07


def test_round_trip() -> None:
    c = compare_paired([0.9, 0.91], [0.8, 0.8], seeds=[0, 1], metric="accuracy", maximize=True)
    assert Comparison.from_dict(c.to_dict()) == c


def test_the_seed_noise_of_a_one_seed_race_comes_from_the_search_or_the_validation_set() -> None:
    # pooled over configurations with two seeds or more: sqrt((1*0.02^2 + 2*0.01^2) / 3)
    pooled = pooled_seed_std([(0.02, 2), (0.01, 3), (None, 1), (None, 0)])
    assert pooled == pytest.approx(math.sqrt((0.02**2 + 2 * 0.01**2) / 3))
    assert pooled_seed_std([(None, 1)]) is None
    # measured: kept, never below the validation set's own sampling noise (p=0.9, n=300: 0.0173)
    assert prior_seed_std(0.03, metric="accuracy", val_samples=300, level=0.9) == 0.03
    assert prior_seed_std(0.001, metric="accuracy", val_samples=300, level=0.9) == pytest.approx(0.01732, abs=1e-4)
    # not measured: 1.25x the binomial noise for a ratio (SAMPLING_TO_SEED); nothing for a loss
    assert prior_seed_std(None, metric="accuracy", val_samples=300, level=0.9) == pytest.approx(
        1.25 * 0.01732, abs=1e-4)
    assert prior_seed_std(None, metric="val_loss", val_samples=300, level=None) is None


def test_one_seed_of_a_large_gain_is_beyond_the_validation_set_s_noise() -> None:
    """small-digits under load: the race held one seed; defaults 0.69 against 0.91 was kept as
    'one seed cannot separate a gain from the seeds' noise'."""
    prior = prior_seed_std(None, metric="accuracy", val_samples=300, level=0.69)
    big = compare_paired([0.91], [0.69], seeds=[100], metric="accuracy", maximize=True, prior_std=prior,
                         resolution=1 / 300, alpha=0.05 / 4)
    assert big.beyond_noise, big.reason
    assert "one paired seed" in big.reason
    small = compare_paired([0.72], [0.69], seeds=[100], metric="accuracy", maximize=True, prior_std=prior,
                           resolution=1 / 300, alpha=0.05 / 4)
    assert not small.beyond_noise  # 3 points on 300 samples: within two seeds' noise


def test_two_seeds_of_a_large_gain_are_judged_against_the_known_noise() -> None:
    """A race cut to two seeds by the time: the t bound at one degree of freedom (25x the spread)
    would keep the defaults; with the seeds' noise known, a 0.3 gain is beyond it and 0.02 is not."""
    prior = prior_seed_std(None, metric="accuracy", val_samples=96, level=0.5)  # 0.102
    big = compare_paired([0.85, 0.9], [0.5, 0.62], seeds=[1, 2], metric="accuracy", maximize=True,
                         prior_std=prior, resolution=1 / 96, alpha=0.05 / 4)
    assert big.beyond_noise, big.reason
    assert "two paired seeds" in big.reason
    t_only = compare_paired([0.85, 0.9], [0.5, 0.62], seeds=[1, 2], metric="accuracy", maximize=True,
                            resolution=1 / 96, alpha=0.05 / 4)
    assert not t_only.beyond_noise  # what the t-test alone said
    small = compare_paired([0.72, 0.70], [0.69, 0.69], seeds=[1, 2], metric="accuracy", maximize=True,
                           prior_std=prior, resolution=1 / 96, alpha=0.05 / 4)
    assert not small.beyond_noise


# -- the race's decision: the paired test, and ranks against every unselected training of the defaults ----------


def test_defaults_whose_seeds_diverge_are_beaten_by_ranks() -> None:
    """lr-too-high at 8 trainings, as measured: the paired t-test's bound was -0.02 and the defaults
    (test 0.48-0.90) were kept beside a choice at 0.92-0.95 on every seed."""
    chosen, defaults = [0.95, 0.9333, 0.9233, 0.9467], [0.4733, 0.85, 0.9033, 0.5333]
    paired = compare_paired(chosen, defaults, seeds=[0, 1, 2, 3], metric="accuracy", maximize=True,
                            resolution=1 / 300)
    assert not paired.beyond_noise
    race = compare_race(chosen, defaults, seeds=[0, 1, 2, 3], metric="accuracy", maximize=True, resolution=1 / 300)
    assert race.beyond_noise
    assert race.extra["rank_p"] == pytest.approx(1 / 70)
    assert "by ranks" in race.reason
    assert race.gain == pytest.approx(paired.gain)


def test_the_rank_test_counts_the_defaults_trainings_outside_the_race() -> None:
    chosen, defaults = [0.95, 0.93, 0.94], [0.47, 0.85, 0.90]
    alone = compare_race(chosen, defaults, seeds=[0, 1, 2], metric="accuracy", maximize=True)
    assert not alone.beyond_noise  # 3 against 3: the smallest p, 1/20, cannot reach alpha / 2
    assert "rank_p" not in alone.extra
    more = compare_race(chosen, defaults, seeds=[0, 1, 2], defaults_more=[0.55, 0.88, float("nan")],
                        metric="accuracy", maximize=True)
    assert more.beyond_noise
    assert more.extra["defaults_outside_race"] == 2
    assert "2 more training(s) of the defaults" in more.describe()


def test_where_ranks_cannot_decide_the_paired_test_keeps_its_full_level() -> None:
    chosen, defaults = [0.90, 0.91, 0.92], [0.80, 0.82, 0.81]
    race = compare_race(chosen, defaults, seeds=[1, 2, 3], metric="accuracy", maximize=True)
    paired = compare_paired(chosen, defaults, seeds=[1, 2, 3], metric="accuracy", maximize=True)
    assert race.lower == paired.lower
    assert race.level == paired.level == pytest.approx(0.95)


def test_ranks_do_not_adopt_a_gain_below_the_resolution() -> None:
    c = compare_race([0.501, 0.502, 0.503, 0.504], [0.5, 0.5, 0.499, 0.498], seeds=[0, 1, 2, 3],
                     metric="accuracy", maximize=True, resolution=0.01)
    assert c.extra["rank_p"] == pytest.approx(1 / 70)
    assert not c.beyond_noise


def test_ranks_for_a_metric_to_minimise() -> None:
    c = compare_race([0.2, 0.21, 0.19, 0.2], [0.9, 0.3, 2.5, 0.35], seeds=[0, 1, 2, 3], metric="val_loss",
                     maximize=False)
    assert c.beyond_noise
    worse = compare_race([0.9, 0.3, 2.5, 0.35], [0.2, 0.21, 0.19, 0.2], seeds=[0, 1, 2, 3], metric="val_loss",
                         maximize=False)
    assert not worse.beyond_noise


def test_the_exact_rank_sum_p_value_matches_the_enumeration_with_ties() -> None:
    from itertools import combinations

    from scipy.stats import rankdata

    rng = np.random.default_rng(3)
    for _ in range(20):
        a = list(rng.integers(0, 5, 4).astype(float))
        b = list(rng.integers(0, 5, 5).astype(float))
        r = rankdata(a + b)
        obs = r[:4].sum()
        subsets = list(combinations(range(9), 4))
        expect = sum(r[list(s)].sum() >= obs - 1e-9 for s in subsets) / len(subsets)
        assert rank_sum_p(a, b, maximize=True) == pytest.approx(expect)


def test_the_race_rarely_adopts_a_configuration_equal_to_heavy_tailed_defaults() -> None:
    """Both from one distribution whose seeds diverge now and then: at most alpha (0.05) of draws,
    the two tests together (Bonferroni) included."""
    rng = np.random.default_rng(1)

    def draw(n: int) -> list[float]:
        return [float(0.9 + rng.normal(0, 0.01) - (0.4 if rng.random() < 0.3 else 0.0)) for _ in range(n)]

    chosen = sum(compare_race(draw(4), draw(4), seeds=list(range(4)), defaults_more=draw(3), metric="accuracy",
                              maximize=True).beyond_noise for _ in range(2000))
    assert chosen / 2000 < 0.06


def test_three_seeds_within_the_known_noise_are_judged_against_it() -> None:
    """noisy-labels under load: three paired seeds, +0.037 on 300 validation samples, were kept as
    noise by the t-test at two degrees of freedom (6x the spread at the race's level), though two
    seeds of the same gain had passed against the known noise."""
    prior = prior_seed_std(None, metric="accuracy", val_samples=300, level=0.9) / 2  # the binomial 0.0173
    args = {"metric": "accuracy", "maximize": True, "resolution": 1 / 300, "alpha": 0.05 / 4}
    c = compare_paired([0.93, 0.92, 0.94], [0.90, 0.87, 0.91], seeds=[1, 2, 3], prior_std=prior, **args)
    assert c.beyond_noise, c.reason
    assert "3 paired seeds" in c.reason
    assert not compare_paired([0.93, 0.92, 0.94], [0.90, 0.87, 0.91], seeds=[1, 2, 3], **args).beyond_noise
    two = compare_paired([0.93, 0.92], [0.90, 0.87], seeds=[1, 2], prior_std=prior, **args)
    assert two.beyond_noise  # as before: the third seed no longer makes the bound wider
    small = compare_paired([0.91, 0.90, 0.92], [0.90, 0.89, 0.90], seeds=[1, 2, 3], prior_std=prior, **args)
    assert not small.beyond_noise  # +0.013: within three seeds' noise
    # pairs spreading beyond the known noise (defaults that diverge): their own t-test decides
    wide = compare_paired([0.95, 0.94, 0.95], [0.90, 0.60, 0.91], seeds=[1, 2, 3], prior_std=prior, **args)
    assert "t-test" in wide.reason
    assert not wide.beyond_noise


@pytest.mark.parametrize("n", [3, 4, 6])
def test_false_choices_stay_rare_against_the_known_noise(n: int) -> None:
    """Equal configurations whose seeds spread by the known noise: adopted in at most alpha of draws."""
    rng = np.random.default_rng(n)
    chosen = 0
    for _ in range(3000):
        a, b = 0.9 + rng.normal(0, 0.02, n), 0.9 + rng.normal(0, 0.02, n)
        chosen += compare_paired(list(a), list(b), seeds=list(range(n)), metric="accuracy", maximize=True,
                                 prior_std=0.02).beyond_noise
    assert chosen / 3000 < 0.06


def test_one_pair_counts_every_training_of_the_defaults_against_the_known_noise() -> None:
    """A race starved to one paired seed: the defaults' trainings outside it (the search's
    evaluations of them) narrow the noise of their mean, so a gain the pair alone leaves within
    noise is beyond it; defaults that spread widely widen it again."""
    prior = prior_seed_std(None, metric="accuracy", val_samples=300, level=0.8)  # 1.25 x 0.0231
    pair = compare_paired([0.86], [0.80], seeds=[1], metric="accuracy", maximize=True, prior_std=prior,
                          resolution=1 / 300)
    assert not pair.beyond_noise, pair.reason
    pooled = compare_race([0.86], [0.80], seeds=[1], defaults_more=[0.81, 0.79, 0.80], metric="accuracy",
                          maximize=True, prior_std=prior, resolution=1 / 300)
    assert pooled.beyond_noise, pooled.reason
    assert "3 more training(s) of the defaults" in pooled.reason
    assert pooled.gain == pytest.approx(0.86 - 0.80)
    wide = compare_race([0.86], [0.80], seeds=[1], defaults_more=[0.60, 0.95, 0.85], metric="accuracy",
                        maximize=True, prior_std=prior, resolution=1 / 300)
    assert not wide.beyond_noise, wide.reason


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 10, 30, 101])
def test_the_t_quantile_is_student_s_to_the_last_digits(df: int) -> None:
    """The bound's quantile is computed from Student's distribution (its finite series at integer
    degrees of freedom), not read from scipy, whose import took 1-5 s inside a short budget."""
    from scipy import stats

    for level in (0.5, 0.9, 0.95, 0.975, 0.99, 0.9975, 0.9999, 0.025):
        assert _t_quantile(level, df) == pytest.approx(float(stats.t.ppf(level, df)), rel=1e-9, abs=1e-12)


def test_the_race_and_the_warm_start_import_no_scipy() -> None:
    """The race's comparison and the search's wide points run inside the budget: a plain Optuna
    loop imports no scipy, so neither do they."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from proftune.optimize._decide import compare_paired\n"
            "from proftune.optimize._warm_start import halton\n"
            "assert len(halton(8, 5, 3)) == 8\n"
            "for n in (1, 2, 5):\n"
            "    compare_paired([0.9 + 0.01 * i for i in range(n)], [0.8] * n, seeds=list(range(n)),\n"
            "                   metric='accuracy', maximize=True, split='val', prior_std=0.02)\n"
            "print(sorted(m for m in sys.modules if m.startswith('scipy')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
