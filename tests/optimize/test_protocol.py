"""The reference is the defaults at their own protocol (issue 39): the budget plan, the race's
seeds from a power calculation, and a shorter protocol adopted only as a time gain at the
defaults' metric. The race's trainings are replaced by a table of results (deterministic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proftune.optimize import _final
from proftune.optimize._budget_plan import MIN_SEARCH_TRIALS, paired_seeds_needed, plan_budget
from proftune.optimize._final import Arm, ArmRun, FinalPlan, run_final
from proftune.track import Store


def _race(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, table: dict[str, list[float]],
          short_epochs: int = 2) -> Any:
    """Race the defaults (10 epochs), one finalist and the finalist at ``short_epochs``; each
    arm's validation metric per round comes from ``table``."""
    rounds: dict[str, int] = {}

    def fake_train(task: Any, arm: Arm, *, plan: FinalPlan, seed: int, limit_s: float, store: Store,
                   folder: Path) -> ArmRun:
        i = rounds.get(arm.name, 0)
        rounds[arm.name] = i + 1
        (folder / f"{_final._slug(arm.name)}-{seed}.pt").write_bytes(b"weights")
        v = table[arm.name][i]
        return ArmRun(seed=seed, run_id=None, val=v, test=v, epochs=int(arm.epochs or plan.epochs),
                      duration_s=0.01, cut=False)

    monkeypatch.setattr(_final, "_train", fake_train)
    params = {"lr": 1e-3}
    defaults = Arm(name="defaults", params=params, source="defaults", epoch_s=0.001, epochs=10)
    finalist = Arm(name="search #1", params={"lr": 3e-3}, source="search", epoch_s=0.001, epochs=10)
    short = Arm(name="search #1 at 2 epochs", params={"lr": 3e-3}, source="search", epoch_s=0.001,
                epochs=short_epochs)
    plan = FinalPlan(metric="accuracy", maximize=True, epochs=10, seeds=4, seed=0, device="cpu",
                     val_samples=200)
    import time

    return run_final(None, defaults, [finalist], plan, store=None, end=time.monotonic() + 60,  # type: ignore[arg-type]
                     folder=tmp_path, shorter=short)


def test_a_shorter_protocol_at_the_defaults_metric_is_adopted_as_a_time_gain(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    table = {"defaults": [0.90, 0.91, 0.90, 0.91] * 3, "search #1": [0.90, 0.905, 0.90, 0.91] * 3,
             "search #1 at 2 epochs": [0.905, 0.91, 0.905, 0.915] * 3}
    out = _race(monkeypatch, tmp_path, table)
    assert out.decision == "shorter"
    assert out.chosen == "search #1 at 2 epochs"
    assert "20% of the training time" in out.note
    assert out.comparison is not None
    assert out.comparison.lower is not None
    assert out.comparison.lower >= -1 / 200


def test_a_shorter_protocol_below_the_defaults_is_not_adopted(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    # the case: 1-epoch models 6-14 points below the defaults at their own 10 epochs
    table = {"defaults": [0.98, 0.99, 0.98, 0.99] * 3, "search #1": [0.97, 0.98, 0.98, 0.98] * 3,
             "search #1 at 2 epochs": [0.85, 0.90, 0.84, 0.92] * 3}
    out = _race(monkeypatch, tmp_path, table)
    assert out.decision == "defaults"
    assert out.chosen == "defaults"
    assert "did not reach the defaults' accuracy at their own protocol" in out.note
    assert out.leader == "search #1"  # the shorter arm is never the leader


def test_a_finalist_better_beyond_noise_at_the_full_protocol_wins(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    table = {"defaults": [0.80, 0.81, 0.80, 0.81] * 3, "search #1": [0.90, 0.91, 0.92, 0.90] * 3,
             "search #1 at 2 epochs": [0.80, 0.80, 0.80, 0.80] * 3}
    out = _race(monkeypatch, tmp_path, table)
    assert out.decision == "chosen"
    assert out.chosen == "search #1"
    assert {r.epochs for r in out.arm("search #1").runs} == {10}


def test_the_plan_sets_the_race_aside_first_and_names_the_budget_that_decides() -> None:
    # one training of the defaults: 10 epochs x 16 s (the README's main job on a busy machine)
    plan = plan_budget(full_epochs=10, epoch_s=16.0, run_overhead_s=0.3, left_s=228.0, spent_s=72.0,
                       budget_s=300.0, after_s=40.0, seeds=3, finalists=2, trial_epochs=1)
    assert not plan.race_fits
    assert plan.min_budget_s > 300
    text = plan.describe()
    assert "~160 s" in text
    assert "needs --budget >=" in text
    assert "not adopted" in text
    roomy = plan_budget(full_epochs=10, epoch_s=0.2, run_overhead_s=0.3, left_s=228.0, spent_s=72.0,
                        budget_s=300.0, after_s=40.0, seeds=3, finalists=2, trial_epochs=10)
    assert roomy.race_fits
    assert roomy.search_s == pytest.approx(228.0 - 40.0 - roomy.race_s)
    assert roomy.race_s == pytest.approx(1.1 * 3 * 3 * (10 * 0.2 + 0.3))
    assert "race the defaults at the full 10 epochs over 3 paired seeds" in roomy.describe()


def test_paired_seeds_follow_the_spread_and_the_gain() -> None:
    few = paired_seeds_needed(seed_std=0.005, gain=0.05, resolution=0.005, alpha=0.05, low=3, high=10)
    many = paired_seeds_needed(seed_std=0.02, gain=0.01, resolution=0.005, alpha=0.05, low=3, high=10)
    assert few == 3
    assert many == 10
    mid = paired_seeds_needed(seed_std=0.01, gain=0.015, resolution=0.005, alpha=0.05, low=3, high=20)
    assert 3 < mid < 20
    assert paired_seeds_needed(seed_std=None, gain=0.1, resolution=0.0, alpha=0.05, low=3, high=10) == 3


def test_the_defaults_reference_training_is_never_cut_by_the_budget_s_end(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """The race starts after the budget's end (a machine that slowed down): every other run is cut
    there, but the defaults' first training runs its own epochs, is the result, and says it ran
    over; a model stopped before the defaults' own epochs would be less than the user had."""
    import time

    limits: list[tuple[str, float]] = []

    def fake_train(task: Any, arm: Arm, *, plan: FinalPlan, seed: int, limit_s: float, store: Store,
                   folder: Path) -> ArmRun:
        limits.append((arm.name, limit_s))
        (folder / f"{_final._slug(arm.name)}-{seed}.pt").write_bytes(b"weights")
        cut = limit_s < 5.0  # one training takes 5 s here
        time.sleep(0.6 if not cut else 0.0)
        return ArmRun(seed=seed, run_id=None, val=0.5 if cut else 0.9, test=0.5 if cut else 0.9,
                      epochs=1 if cut else 10, duration_s=0.6, cut=cut)

    monkeypatch.setattr(_final, "_train", fake_train)
    defaults = Arm(name="defaults", params={"lr": 1e-3}, source="defaults", epoch_s=0.5, epochs=10)
    finalist = Arm(name="search #1", params={"lr": 3e-3}, source="search", epoch_s=0.5, epochs=10)
    plan = FinalPlan(metric="accuracy", maximize=True, epochs=10, seeds=2, seed=0, device="cpu", val_samples=200)
    now = time.monotonic()
    out = run_final(None, defaults, [finalist], plan, store=None, end=now - 1, hard_end=now - 1,  # type: ignore[arg-type]
                    cap_end=now - 1, folder=tmp_path)
    assert limits[0] == ("defaults", float("inf"))
    assert all(limit < 5.0 for _, limit in limits[1:])  # the others stop at the budget's end
    assert out.decision == "defaults"
    run = out.model_run()
    assert run is not None
    assert not run.cut
    assert run.epochs == 10
    assert (tmp_path / "model.pt").is_file()
    assert "s past the budget's end: a model stopped before their own epochs" in out.note


def test_a_race_of_fewer_seeds_where_the_asked_ones_do_not_fit() -> None:
    """Three paired seeds of 2 arms at ~4.3 s a training need ~28 s; 20 s left (less 4 s after)
    hold one: the race runs over it (one pair decides only a gain far beyond the seeds' noise)
    rather than not at all, and the plan says it had asked for three."""
    plan = plan_budget(full_epochs=10, epoch_s=0.4, run_overhead_s=0.3, left_s=20.0, spent_s=4.0,
                       budget_s=24.0, after_s=4.0, seeds=3, finalists=2, trial_epochs=10, search_done=True)
    assert plan.race_fits
    assert plan.seeds == 1
    assert plan.seeds_wanted == 3
    assert plan.race_s == pytest.approx(1.1 * 1 * 2 * (10 * 0.4 + 0.3))
    assert "over 1 paired seed (of the 3 asked for" in plan.describe()
    # where even one pair does not fit, nothing races, and the budget named is a one-pair race's
    tight = plan_budget(full_epochs=10, epoch_s=0.4, run_overhead_s=0.3, left_s=8.0, spent_s=4.0,
                        budget_s=12.0, after_s=4.0, seeds=3, finalists=2, trial_epochs=10, search_done=True)
    assert not tight.race_fits
    assert tight.min_budget_s == pytest.approx(4.0 + 1.1 * 2 * (10 * 0.4 + 0.3) + MIN_SEARCH_TRIALS * 4.3 + 4.0)
