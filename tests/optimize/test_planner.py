"""The plan of the budget lives in ``_planner.Planner``: a stage reads it as ``ctx.planner``, the loop
implements none of it, and the contract a stage is given stays a handful of members."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from proftune.optimize import Budget, Planner, StageContext
from proftune.optimize._api import _Loop
from proftune.optimize._budget_plan import MIN_COMPRESS_S, RESERVED_CANDIDATES
from proftune.optimize._state import OptimizeState

#: What a stage is given: the task, its defaults, the options, the Store, the state, the folder, the
#: device, the study and spec, the held-out data, progress, the clock and the plan. A new member is
#: a change of the public contract: add it here on purpose.
CONTRACT = {"task", "defaults", "defaults_record", "cfg", "v", "store", "state", "out", "dev", "study", "spec",
            "holdout", "say", "budget", "planner"}
PLANNING = ("budget_plan", "epoch_s", "compress_reserve", "rank_epoch", "baseline_reusable", "race_seeds_for")


def test_a_stage_is_given_a_handful_of_members_and_the_loop_plans_nothing() -> None:
    members = set(StageContext.__annotations__) | {n for n in vars(StageContext) if not n.startswith("_")}
    assert members == CONTRACT
    assert [m for m in PLANNING if hasattr(_Loop, m)] == []
    assert all(callable(getattr(Planner, m)) for m in PLANNING)


def _planner(tmp_path: Path, clock: Budget, *, goal: str = "none", budget_s: float = 100.0) -> Planner:
    state = OptimizeState.load_or_new(tmp_path, {"task": "t", "study": "s"})
    v = SimpleNamespace(cfg=SimpleNamespace(seeds=3, goal=goal), metric="accuracy", maximize=True, budget_s=budget_s)
    return Planner(state=state, v=v, clock=clock, holdout=SimpleNamespace(val_samples=200),  # type: ignore[arg-type]
                   out=tmp_path, full_epochs=10)


def test_the_plan_reads_the_clock_when_it_is_asked_for(tmp_path: Path) -> None:
    clock = Budget(100.0, spent_s=10.0)
    planner = _planner(tmp_path, clock)
    first = planner.budget_plan()
    assert first.left_s == pytest.approx(87.0, abs=0.5)  # 97 s to the stages, 10 s spent
    # before the stages before the search ran, their shares are taken from what is left
    assert first.after_s == pytest.approx(sum(clock.stage_s(s) for s in ("health", "compute", "layer_value")),
                                          rel=1e-3)
    clock.started -= 30.0  # 30 s later: the same planner plans the seconds left now
    later = planner.budget_plan()
    assert later.left_s == pytest.approx(57.0, abs=0.5)
    assert later.search_s < first.search_s
    assert later.finalists <= RESERVED_CANDIDATES
    # before the baseline measured anything: one second an epoch, a rank at epoch 1, its run reused
    assert planner.epoch_s() == 1.0
    assert planner.rank_epoch() == 1
    assert planner.baseline_reusable() is True
    assert planner.compress_reserve() == 0.0  # goal none: nothing kept for compression


def test_the_compress_reserve_is_a_fifth_of_the_budget_within_one_sweep(tmp_path: Path) -> None:
    assert _planner(tmp_path, Budget(30.0), goal="latency", budget_s=30.0).compress_reserve() == MIN_COMPRESS_S
    assert _planner(tmp_path, Budget(150.0), goal="latency", budget_s=150.0).compress_reserve() == 30.0
