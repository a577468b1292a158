"""Decisions on all the data there is (issue 60): a task without ``test_data`` selects on all of
its validation samples; the held-out figures come from the race's rounds on the task's other
partitions (``Task.resplit``) or, where there are none, from an estimate corrected for the
winner's curse. Trainings are faked (values injected) where the rule, not the training, is under test.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from proftune._holdout import held_out_info
from proftune.examples import TensorBatches
from proftune.optimize import _final
from proftune.optimize._final import Arm, ArmRun, FinalOutcome, FinalPlan, held_out_estimate, run_final, sampling_std

from .tasks import X_TEST, X_VAL, Y_TEST, TinyTask
from .test_small_budgets import _FakeTrain, _Splittable


class _NoTestFake(_FakeTrain):
    """``_final._train`` for a task without test_data: validation figures only (``test`` None)."""

    def result(self, seed: int, val: float) -> ArmRun:
        return ArmRun(seed=seed, run_id=None, val=val, test=None, epochs=1, duration_s=0.01, cut=False,
                      val_metrics={"accuracy": val})


def _plan(**kw: Any) -> FinalPlan:
    return FinalPlan(**{"metric": "accuracy", "maximize": True, "epochs": 1, "seeds": 3, "seed": 0, "device": "cpu",
                        "val_samples": 96, **kw})


def _arm(name: str, lr: float) -> Arm:
    return Arm(name=name, params={**TinyTask.default_params, "lr": lr}, source=name, epoch_s=0.01)


class _WithTest(TinyTask):
    def test_data(self, batch_size: int) -> Iterable[Any]:
        return TensorBatches(X_TEST, Y_TEST, batch_size, shuffle=False)


def test_selection_reads_all_of_validation_and_the_figures_source_is_named() -> None:
    """No halving: the selection's samples are all of validation, whichever source the figures have."""
    n = X_VAL.shape[0]
    own = held_out_info(_WithTest(), batch_size=7)
    assert (own.source, own.val_samples, own.test_samples) == ("task.test_data", n, X_TEST.shape[0])
    parts = held_out_info(_Splittable(), batch_size=7)
    assert (parts.source, parts.val_samples) == ("resplits", n)
    assert "resplit" in parts.describe()
    assert f"all {n} validation samples" in parts.describe()
    est = held_out_info(TinyTask(), batch_size=7)
    assert (est.source, est.val_samples) == ("estimate", n)
    assert "winner's curse" in est.describe()
    # a large validation set carries little curse: its own figures, corrected, not a race on partitions
    assert held_out_info(_Splittable(), batch_size=7, resplit_below=n).source == "estimate"


def test_the_rounds_on_other_partitions_give_the_held_out_figures(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _NoTestFake({"defaults": itertools.cycle([0.80, 0.82]), "search #1": itertools.cycle([0.90, 0.91])})
    monkeypatch.setattr(_final, "_train", fake)
    out = run_final(_Splittable(), _arm("defaults", 1e-2), [_arm("search #1", 3e-2)],
                    _plan(seeds=3, resplit=True, compared=50), store=None,  # type: ignore[arg-type]
                    end=time.monotonic() + 60, folder=tmp_path)
    assert len(out.seeds) >= 3
    for arm in out.arms:
        by_seed = {r.seed: r for r in arm.runs}
        first = by_seed[out.seeds[0]]
        assert first.test is None  # round 0: the search's own split, selected on
        for s in out.seeds[1:]:
            assert by_seed[s].test == by_seed[s].val  # another partition's validation
    assert out.comparison_test is not None
    assert out.comparison_test.seeds == out.seeds[1:]
    assert out.estimate is None  # figures measured, none estimated


def test_without_partitions_the_figure_is_corrected_for_the_winners_curse(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _NoTestFake({"defaults": itertools.repeat(0.80), "search #1": itertools.cycle([0.90, 0.92])})
    monkeypatch.setattr(_final, "_train", fake)
    out = run_final(TinyTask(), _arm("defaults", 1e-2), [_arm("search #1", 3e-2)],
                    _plan(seeds=3, compared=200), store=None,  # type: ignore[arg-type]
                    end=time.monotonic() + 60, folder=tmp_path)
    assert out.chosen == "search #1"
    est = out.estimate
    assert est is not None
    assert all(r.test is None for a in out.arms for r in a.runs)
    s = sampling_std("accuracy", 96, 0.80)
    assert s is not None
    assert est.sampling_std == pytest.approx(s)
    assert est.bias == pytest.approx(s * math.sqrt(2 * math.log(200)))
    gain = out.comparison.gain if out.comparison else None
    assert est.gain_val == pytest.approx(gain)
    assert est.gain == pytest.approx(max(0.0, (gain or 0) - est.bias))
    assert est.chosen == pytest.approx(0.80 + est.gain)
    assert "expected on new data" in est.describe()
    # the record reads back (schema 2)
    assert FinalOutcome.from_dict(out.to_dict()).estimate == est


def test_the_correction_never_turns_a_gain_into_a_loss_and_grows_with_the_configurations_compared() -> None:
    seeds = [1, 2, 3]
    runs = {"d": [0.80, 0.81, 0.79], "c": [0.83, 0.84, 0.82]}

    def arm(name: str) -> Arm:
        return Arm(name=name, params={}, source=name, runs=tuple(
            ArmRun(seed=s, run_id=None, val=v, test=None, epochs=1, duration_s=0.0, cut=False)
            for s, v in zip(seeds, runs[name], strict=True)))

    few = held_out_estimate(arm("c"), arm("d"), _plan(val_samples=2000), seeds=seeds, compared=2)
    many = held_out_estimate(arm("c"), arm("d"), _plan(val_samples=2000), seeds=seeds, compared=500)
    assert few.gain_val == pytest.approx(0.03)
    assert few.gain is not None
    assert many.gain is not None
    assert 0.0 <= many.gain < few.gain < 0.03
    assert many.gain == 0.0  # 0.03 on 2000 samples among 500 configurations: the curse explains it
    assert held_out_estimate(arm("c"), arm("d"), _plan(), seeds=seeds, compared=2).gain == 0.0  # on 96 samples
    kept = held_out_estimate(arm("d"), arm("d"), _plan(), seeds=seeds, compared=500)
    assert (kept.gain, kept.bias) == (0.0, 0.0)
    assert kept.chosen == pytest.approx(0.80)
    # a loss has no known sampling noise: no estimate, said so
    loss = held_out_estimate(arm("c"), arm("d"), _plan(metric="val_loss", maximize=False), seeds=seeds, compared=5)
    assert loss.gain is None
    assert loss.chosen is None
    assert "not known" in loss.describe()


def test_the_race_plans_its_seeds_for_the_gain_left_after_the_search_s_curse() -> None:
    """On 300 validation samples the search's best of 10 trials measured +0.04 over the defaults:
    about 0.032 of it is the best of 10 draws of one figure's sampling noise (0.0147 at 0.93), so
    the race plans for what is left, at the level it decides at (its challengers share the error
    rate), not the three seeds that could only show +0.04."""
    import statistics
    from types import SimpleNamespace

    from proftune.optimize._budget_plan import paired_seeds_needed
    from proftune.optimize._final import MAX_ROUNDS
    from proftune.optimize._planner import Planner
    from proftune.optimize._search import ConfigGroup

    # what the race's seeds read: --seeds, the metric, the validation set's size (no clock, no state)
    planner = Planner(state=None, v=SimpleNamespace(cfg=SimpleNamespace(seeds=3), metric="accuracy"),  # type: ignore[arg-type]
                      clock=None, holdout=SimpleNamespace(val_samples=300), out=None, full_epochs=10)  # type: ignore[arg-type]

    def group(values: list[float]) -> ConfigGroup:
        return ConfigGroup(params={}, values=values, trials=[], arms=[], mean=statistics.fmean(values),
                           std=statistics.stdev(values), n=len(values))

    defaults, best = group([0.92, 0.93, 0.94]), group([0.96, 0.97, 0.98])
    one = planner.race_seeds_for(defaults, best, 0.01)
    many = planner.race_seeds_for(defaults, best, 0.01, compared=10)
    noise = sampling_std("accuracy", 300, 0.93)
    assert noise is not None
    left = 0.04 - noise * math.sqrt(2 * math.log(10))
    assert 0 < left < 0.01
    assert one < many
    assert many == MAX_ROUNDS
    assert many == min(MAX_ROUNDS, paired_seeds_needed(seed_std=noise, gain=left, resolution=1 / 300,
                                                       alpha=0.025, low=3, high=MAX_ROUNDS))
    # the level the race decides at, two challengers sharing 0.05: +0.02 on 300 samples asks more seeds
    # than at 0.05 alone
    at_race = paired_seeds_needed(seed_std=noise, gain=0.02, resolution=1 / 300, alpha=0.025, low=3, high=99)
    assert at_race > paired_seeds_needed(seed_std=noise, gain=0.02, resolution=1 / 300, alpha=0.05, low=3, high=99)
    half = group([0.92, 0.93, 0.94]), group([0.94, 0.95, 0.96])  # +0.02, no trials compared: no curse
    assert planner.race_seeds_for(*half, 0.01) == min(MAX_ROUNDS, at_race)
