"""The gain found at a few trainings (issue 45): no training paid twice, the model that stands for
the decision, and a race that decides on more of the data than one split.

- the baseline's training of the defaults (their own epochs, not cut) is the defaults' first seed
  in the race: the plan sets aside one training less and the race does not train it again;
- the model handed back is the chosen arm's seed best on validation, its figure shrunk toward the
  mean by the share of its seeds' spread beyond the validation set's sampling noise;
- where validation is small and the task offers partitions of its samples (``Task.resplit``),
  each round of the race trains and judges on its own partition.

Trainings are faked (values injected) where the rule, not the training, is under test.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import proftune
from proftune._holdout import HeldOutTask
from proftune.examples import TensorBatches, resplit_tensors
from proftune.optimize import _final
from proftune.optimize._budget_plan import RACE_SHARE_MAX, plan_budget
from proftune.optimize._final import Arm, ArmRun, FinalPlan, representative, run_final, sampling_std
from proftune.task import Task, TaskWrapper

from .tasks import X_TRAIN, X_VAL, Y_TRAIN, Y_VAL, TinyTask


def _run(seed: int, val: float, test: float | None = None) -> ArmRun:
    return ArmRun(seed=seed, run_id=None, val=val, test=val if test is None else test, epochs=1, duration_s=0.01,
                  cut=False)


class _FakeTrain:
    """Stands in for ``_final._train``: each arm's validation figures in turn, every call recorded
    (arm, seed, the task it trained on) and a model file left where the race looks for it."""

    def __init__(self, values: dict[str, Iterator[float]]) -> None:
        self.values, self.calls = values, []  # type: ignore[var-annotated]

    def __call__(self, task: Task, arm: Arm, *, plan: FinalPlan, seed: int, limit_s: float, store: Any,
                 folder: Path) -> ArmRun:
        self.calls.append((arm.name, seed, task))
        torch.save({"w": torch.zeros(1)}, folder / f"{_final._slug(arm.name)}-{seed}.pt")
        return self.result(seed, next(self.values[arm.name]))

    def result(self, seed: int, val: float) -> ArmRun:
        return _run(seed, val)


def _plan(**kw: Any) -> FinalPlan:
    return FinalPlan(**{"metric": "accuracy", "maximize": True, "epochs": 1, "seeds": 3, "seed": 0, "device": "cpu",
                        "val_samples": 96, **kw})


def _arm(name: str, lr: float) -> Arm:
    return Arm(name=name, params={**TinyTask.default_params, "lr": lr}, source=name, epoch_s=0.01)


# -- the baseline's training is the defaults' first seed ---------------------------------------------------
def test_the_plan_does_not_pay_the_baselines_training_again() -> None:
    kw: dict[str, Any] = {"full_epochs": 10, "epoch_s": 0.1, "run_overhead_s": 0.0, "spent_s": 5.0, "budget_s": 8.0,
                          "after_s": 0.0, "seeds": 3, "finalists": 1, "trial_epochs": 10, "search_done": True}
    paid, reused = plan_budget(left_s=20.0, **kw), plan_budget(left_s=20.0, done_runs=1, **kw)
    assert paid.race_s == pytest.approx(1.1 * 6 * 1.0)
    assert reused.race_s == pytest.approx(1.1 * 5 * 1.0)
    # one pair (the defaults' run done, one finalist to train) fits in 1.2 trainings; two did not
    assert not plan_budget(left_s=1.2, **kw).race_fits
    tight = plan_budget(left_s=1.2, done_runs=1, **kw)
    assert tight.race_fits
    assert tight.seeds == 1
    # before the search: its two first trials (the computed centre and one local step) and that pair
    before = {**kw, "search_done": False}
    assert plan_budget(left_s=3.2, done_runs=1, **before).race_fits  # 1.1 + 2 x 1.0
    assert not plan_budget(left_s=3.0, done_runs=1, **before).race_fits


def test_the_races_seeds_leave_the_search_most_of_a_small_budget() -> None:
    """Eight trainings left: three planned seeds (5 trainings with the baseline's reused) would
    leave the search three; the plan takes fewer seeds, the race at most RACE_SHARE_MAX of the time,
    and keeps three at forty trainings."""
    kw: dict[str, Any] = {"full_epochs": 10, "epoch_s": 0.1, "run_overhead_s": 0.0, "spent_s": 2.0, "budget_s": 10.0,
                          "after_s": 0.0, "seeds": 3, "finalists": 1, "trial_epochs": 10, "done_runs": 1}
    small = plan_budget(left_s=8.0, **kw)
    assert small.race_fits
    assert small.seeds < 3
    assert small.race_s <= RACE_SHARE_MAX * 8.0
    assert small.search_s >= 8.0 - RACE_SHARE_MAX * 8.0
    assert plan_budget(left_s=40.0, **kw).seeds == 3


def test_the_race_takes_the_baselines_run_as_the_defaults_first_seed(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeTrain({"defaults": itertools.repeat(0.5), "search #1": itertools.repeat(0.9)})
    monkeypatch.setattr(_final, "_train", fake)
    model = tmp_path / "baseline_model.pt"
    torch.save({"w": torch.ones(1)}, model)
    out = run_final(TinyTask(), _arm("defaults", 1e-2), [_arm("search #1", 3e-2)], _plan(seeds=3),
                    store=None, end=time.monotonic() + 60, folder=tmp_path,  # type: ignore[arg-type]
                    first=(_run(7, 0.5), model))
    assert out.seeds[0] == 7
    trained = [(name, seed) for name, seed, _ in fake.calls]
    assert ("defaults", 7) not in trained  # not trained again
    assert ("search #1", 7) in trained  # its pair at the baseline's seed
    assert [r.seed for r in out.arm("defaults").runs][:1] == [7]
    assert {r.seed for r in out.arm("defaults").runs} == set(out.seeds) == {r.seed for r in out.arm("search #1").runs}
    assert out.decision == "chosen"


def test_the_race_takes_the_searchs_own_training_of_its_best_as_its_first_seed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's training of its best at the baseline's seed and the protocol is that arm's
    first run: the first round trains nothing, and its kept model is the one handed back where
    that seed is the arm's best."""
    fake = _FakeTrain({"defaults": itertools.repeat(0.5), "search #1": itertools.repeat(0.8)})
    monkeypatch.setattr(_final, "_train", fake)
    base, best = tmp_path / "baseline_model.pt", tmp_path / "trial-3.pt"
    torch.save({"w": torch.ones(1)}, base)
    torch.save({"w": torch.full((1,), 3.0)}, best)
    out = run_final(TinyTask(), _arm("defaults", 1e-2), [_arm("search #1", 3e-2)], _plan(seeds=2),
                    store=None, end=time.monotonic() + 60, folder=tmp_path,  # type: ignore[arg-type]
                    first=(_run(7, 0.5), base), first_more=(_run(7, 0.9), best))
    trained = [(name, seed) for name, seed, _ in fake.calls]
    assert ("defaults", 7) not in trained
    assert ("search #1", 7) not in trained
    assert [r.seed for r in out.arm("search #1").runs][:1] == [7]
    assert out.arm("search #1").runs[0].val == 0.9
    assert out.decision == "chosen"
    assert out.model_seed == 7
    assert torch.load(tmp_path / "model.pt", weights_only=True)["w"].item() == 3.0  # the search's own model
    # a run at another seed than the baseline's does not pair with it: trained again
    fake.calls.clear()
    run_final(TinyTask(), _arm("defaults", 1e-2), [_arm("search #1", 3e-2)], _plan(seeds=1),
              store=None, end=time.monotonic() + 60, folder=tmp_path / "other",  # type: ignore[arg-type]
              first=(_run(7, 0.5), base), first_more=(_run(8, 0.9), best))
    assert next((n, s) for n, s, _ in fake.calls) == ("search #1", 7)


@pytest.mark.parametrize(("reused", "chosen"), [(0.86, False), (0.99, True)])
def test_the_searchs_own_run_counts_less_the_winners_curse_of_its_draws(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reused: float, chosen: bool) -> None:
    """The search's training of its best is the best of ``compared`` draws on the same validation
    data: in the decision its figure counts less sqrt(2 ln compared) times one figure's sampling
    noise. A lead of 0.06 on 200 samples (one figure's noise 0.028) from the best of 20 draws is
    what chance gives; 0.19 is not."""
    monkeypatch.setattr(_final, "_train", _FakeTrain({"defaults": itertools.repeat(0.8),
                                                       "search #1": itertools.repeat(reused)}))
    base, best = tmp_path / "baseline_model.pt", tmp_path / "trial-3.pt"
    torch.save({"w": torch.ones(1)}, base)
    torch.save({"w": torch.ones(1)}, best)
    out = run_final(TinyTask(), _arm("defaults", 1e-2), [_arm("search #1", 3e-2)],
                    _plan(seeds=1, val_samples=200, compared=20, prior_std=0.03),
                    store=None, end=time.monotonic() - 1, folder=tmp_path,  # type: ignore[arg-type]
                    first=(_run(7, 0.8), base), first_more=(_run(7, reused), best))
    assert out.seeds == [7]  # the one pair made before the race, no time for another
    assert (out.decision == "chosen") is chosen
    assert out.arm("search #1").values("val", [7]) == [reused]  # the run keeps its own figure


# -- the model handed back -----------------------------------------------------------------------------------
def test_within_the_sampling_noise_the_best_seed_is_handed_back_with_its_figure_shrunk_to_the_mean() -> None:
    """The best seed on validation is expected at least as good as the median on new data (the
    headroom tasks: +0.007 to +0.05 on test over the median of 10); within the validation set's
    sampling noise its expected figure is the mean, and the note says so."""
    noise = sampling_std("accuracy", 300, 0.9)  # ~0.017
    assert noise == pytest.approx((0.9 * 0.1 / 300) ** 0.5)
    runs = [_run(s, v) for s, v in enumerate([0.90, 0.91, 0.89, 0.905, 0.895])]  # spread 0.008
    pick, how = representative(runs, sampling_std=noise)
    assert pick is not None
    assert pick.val == 0.91
    assert "the best of its 5 seeds" in how
    assert "about 0% of their variance is the models' own" in how
    assert "expected at 0.9 on new data" in how  # the mean: nothing of its gain is the model's
    assert representative(runs[:1], sampling_std=noise) == (runs[0], "")  # one seed: nothing to choose


def test_beyond_the_sampling_noise_the_best_seed_is_the_models_own() -> None:
    noise = sampling_std("accuracy", 300, 0.75)  # ~0.025
    runs = [_run(s, v) for s, v in enumerate([0.70, 0.74, 0.83, 0.76, 0.72])]  # spread ~0.05
    pick, how = representative(runs, sampling_std=noise)
    assert pick is not None
    assert pick.seed == 2
    assert "the best of its 5 seeds" in how
    assert "expected at" in how  # the gain shrunk by the share of the spread that is the models'
    low, _ = representative(runs, sampling_std=noise, maximize=False)  # a metric to minimise: its lowest
    assert low is not None
    assert low.seed == 0
    # unknown noise (a loss, a custom metric): still the best, its figure called optimistic
    unknown, how = representative(runs, sampling_std=None)
    assert unknown is not None
    assert unknown.seed == 2
    assert "its own figure is optimistic" in how
    assert sampling_std("val_loss", 300, 0.5) is None


# -- the race on partitions of the data ----------------------------------------------------------------------
class _Splittable(TinyTask):
    """TinyTask whose training and validation samples are of one kind: it offers partitions."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.tensors = (X_TRAIN, Y_TRAIN), (X_VAL, Y_VAL)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        return TensorBatches(*self.tensors[0], batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        return TensorBatches(*self.tensors[1], batch_size, shuffle=False)

    def resplit(self, index: int) -> Task | None:
        other = _Splittable(index)
        other.tensors = resplit_tensors((X_TRAIN, Y_TRAIN), (X_VAL, Y_VAL), index)
        return other


def test_resplit_tensors_partitions_the_pooled_samples_at_their_own_sizes() -> None:
    (xt, _), (xv, yv) = resplit_tensors((X_TRAIN, Y_TRAIN), (X_VAL, Y_VAL), 3)
    assert (xt.shape[0], xv.shape[0]) == (X_TRAIN.shape[0], X_VAL.shape[0])
    pooled = torch.cat([X_TRAIN, X_VAL])
    rows = {tuple(r.tolist()) for r in pooled}
    assert {tuple(r.tolist()) for r in torch.cat([xt, xv])} == rows  # every sample once
    assert not {tuple(r.tolist()) for r in xt} & {tuple(r.tolist()) for r in xv}
    assert not torch.equal(xv, X_VAL)  # another partition
    again = resplit_tensors((X_TRAIN, Y_TRAIN), (X_VAL, Y_VAL), 3)
    assert torch.equal(again[1][0], xv)  # seeded by the index
    assert resplit_tensors((X_TRAIN, Y_TRAIN), (X_VAL, Y_VAL), 0)[1][0] is X_VAL
    # labels travel with their samples
    lookup = {tuple(r.tolist()): int(y) for r, y in zip(pooled, torch.cat([Y_TRAIN, Y_VAL]), strict=True)}
    assert all(lookup[tuple(r.tolist())] == int(y) for r, y in zip(xv, yv, strict=True))
    with pytest.raises(ValueError, match="as many tensors"):
        resplit_tensors((X_TRAIN, Y_TRAIN), (X_VAL,), 1)


def test_a_task_has_one_split_unless_it_says_otherwise_and_a_holdout_keeps_it() -> None:
    assert TinyTask().resplit(1) is None  # the default: the two sets may differ in kind
    held = HeldOutTask(_Splittable())
    assert held.resplit(1) is None  # its test split is part of validation: a partition would leak it
    wrapped = TaskWrapper(_Splittable())
    other = wrapped.resplit(2)
    assert isinstance(other, TaskWrapper)
    assert other.inner.index == 2  # type: ignore[attr-defined]


def test_each_round_of_the_race_trains_and_judges_on_its_own_partition(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeTrain({"defaults": itertools.repeat(0.5), "search #1": itertools.repeat(0.9)})
    monkeypatch.setattr(_final, "_train", fake)
    out = run_final(_Splittable(), _arm("defaults", 1e-2), [_arm("search #1", 3e-2)], _plan(seeds=3, resplit=True),
                    store=None, end=time.monotonic() + 60, folder=tmp_path)  # type: ignore[arg-type]
    by_round = {}
    for name, seed, task in fake.calls:
        by_round.setdefault(out.seeds.index(seed), set()).add((name, task.index))  # type: ignore[attr-defined]
    assert len(by_round) == len(out.seeds) >= 3
    for r, trained in by_round.items():  # both arms of round r on partition r (paired), round 0 the task's own
        assert trained == {("defaults", r), ("search #1", r)}
    # without the plan's word the task's own split throughout
    fake.calls.clear()
    run_final(_Splittable(), _arm("defaults", 1e-2), [_arm("search #1", 3e-2)], _plan(seeds=3),
              store=None, end=time.monotonic() + 60, folder=tmp_path / "b")  # type: ignore[arg-type]
    assert {task.index for _, _, task in fake.calls} == {0}  # type: ignore[attr-defined]


def test_optimize_races_on_partitions_where_validation_is_small(tmp_path: Path) -> None:
    """The loop end to end on a task that offers partitions: its race note says so, and every
    round after the first trained on its own partition (the figures differ from the task's own)."""
    db = f"sqlite:///{tmp_path / 'o.db'}"
    result = proftune.optimize(_WithTest(), budget=12, out=str(tmp_path / "o"), db=db, goal="none", seeds=3)
    note = result.vs_baseline.race_note or ""
    assert "its own partition of the training and validation samples" in note
    assert "validation has 96 samples" in note
    # the baseline's training measured the defaults at the trials' protocol: the search did not
    # train them again, and their group is that training
    state = json.loads((tmp_path / "o" / "state.json").read_text())
    search = state["stages"]["search"]["outputs"]
    assert search["epochs_per_trial"] == _WithTest.default_epochs
    group = search["defaults"]
    assert group["arms"][0] == "baseline"  # their first value is the baseline's training
    baseline = state["stages"]["baseline"]["outputs"]["defaults"]["metrics"]["accuracy"]
    assert group["values"][0] == pytest.approx(baseline)
    # the search enqueued no first evaluation of them; on a machine fast enough to reach its last
    # share it re-evaluates them (arm "defaults"), every one a repeat inside the same group
    assert search["arms"].get("defaults", 0) == len(group["arms"]) - 1 <= 2


class _WithTest(_Splittable):
    """_Splittable with a test split of its own (a held-out part of validation would block the partitions)."""

    name = "tiny-splittable"

    def test_data(self, batch_size: int) -> Iterable[Any]:
        from .tasks import _data

        x, y = _data(96, 2)
        return TensorBatches(x, y, batch_size, shuffle=False)

    def resplit(self, index: int) -> Task | None:
        other = _WithTest(index)
        other.tensors = resplit_tensors((X_TRAIN, Y_TRAIN), (X_VAL, Y_VAL), index)
        return other


def test_the_race_plans_more_seeds_where_the_defaults_spread_widely() -> None:
    """A rate too high makes the defaults' seeds differ by tens of points: the paired difference
    spreads by that, not by the leader's small spread, so the race needs more seeds for the same gap."""
    from types import SimpleNamespace

    from proftune.optimize._planner import Planner
    from proftune.optimize._search import ConfigGroup

    # what the race's seeds read: --seeds, the metric, the validation set's size (no clock, no state)
    planner = Planner(state=None, v=SimpleNamespace(cfg=SimpleNamespace(seeds=3), metric="accuracy"),  # type: ignore[arg-type]
                      clock=None, holdout=SimpleNamespace(val_samples=300), out=None, full_epochs=10)  # type: ignore[arg-type]

    def group(mean: float, values: list[float]) -> ConfigGroup:
        import statistics

        return ConfigGroup(params={}, values=values, trials=[], arms=[], mean=mean, std=statistics.stdev(values),
                           n=len(values))

    leader = group(0.96, [0.95, 0.96, 0.97])
    steady = group(0.74, [0.73, 0.74, 0.75])
    wild = group(0.74, [0.50, 0.74, 0.98])
    calm = planner.race_seeds_for(steady, leader, 0.01)
    wide = planner.race_seeds_for(wild, leader, 0.01)
    assert calm == 3
    assert wide > calm


class _Slowish(TinyTask):
    """TinyTask whose 12 batches wait 0.12 s each (~1.5 s a training): a sixth of a 9 s budget,
    three times the baseline stage's share."""

    name = "tiny-slowish"

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        for batch in super().train_data(batch_size, params):
            time.sleep(0.12)
            yield batch


def test_the_baselines_training_of_the_defaults_runs_their_epochs_and_is_not_trained_again(tmp_path: Path) -> None:
    """Cut at the stage's share (as it was), the defaults' training was trained again in full by
    the race: on a loaded machine that training was the race's time, and the defaults were kept."""
    db = f"sqlite:///{tmp_path / 'o.db'}"
    proftune.optimize(_Slowish(), budget=9, out=str(tmp_path / "o"), db=db, goal="none", seeds=1)
    state = json.loads((tmp_path / "o" / "state.json").read_text())
    baseline = state["stages"]["baseline"]["outputs"]
    assert baseline["defaults"]["epochs"] == _Slowish.default_epochs
    assert baseline["no_tricks"]["epochs"] <= 2  # 9 s hold ~6 trainings: the no-tricks run is only timed
    assert "timed over" in baseline["no_tricks"]["stop_reason"]
    race = state["stages"]["final"]["outputs"]["race"]
    first = race["arms"][0]["runs"][0]
    assert first["run_id"] == baseline["defaults"]["run_id"]  # the race's first defaults run is the baseline's
    search = state["stages"]["search"]["outputs"]
    if search["epochs_per_trial"] >= _Slowish.default_epochs and len(race["arms"]) > 1:
        # trials at the task's own epochs: the search's training of its best is its first race run
        kept = {k["run_id"] for k in search["kept"]}
        assert kept
        assert race["arms"][1]["runs"][0]["run_id"] in kept
        assert not (tmp_path / "o" / "search_models").exists()  # the race copied what it took


def test_a_race_planned_below_seeds_leaves_the_search_its_trials(tmp_path: Path) -> None:
    """At a few trainings the plan races fewer pairs than --seeds asks; the search's reserve grows
    only from a measured spread of the defaults, never from --seeds before any trial (it then
    took the search's whole time: no trial ran, and the race had no challenger)."""
    db = f"sqlite:///{tmp_path / 'o.db'}"
    proftune.optimize(_Slowish(), budget=20, out=str(tmp_path / "o"), db=db, goal="none", seeds=5)
    state = json.loads((tmp_path / "o" / "state.json").read_text())
    search = state["stages"]["search"]["outputs"]
    assert search["budget_plan"]["seeds"] < 5  # the race was planned below --seeds (5 pairs hold ~16 s)
    assert sum(search["counts"].values()) >= 1


def test_cheap_defaults_train_alone_in_the_time_left_for_the_rank_test(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """big-batch at 8 trainings: the defaults (0.03 s a training) diverge on some seeds, the leader
    (0.5 s) is steady; three pairs decide nothing (the paired bound is wide, three runs against three
    cannot reach the rank test's level), and the time left, too short for another pair, holds seven
    more trainings of the defaults alone: with them the rank test decides."""
    clock = [0.0]
    cost = {"defaults": 0.03, "search #1": 0.5}
    values = {"defaults": itertools.cycle([0.47, 0.85, 0.90, 0.53]), "search #1": itertools.cycle([0.95, 0.93, 0.92])}

    def fake(task: Task, arm: Arm, *, plan: FinalPlan, seed: int, limit_s: float, store: Any, folder: Path) -> ArmRun:
        clock[0] += cost[arm.name]
        torch.save({"w": torch.zeros(1)}, folder / f"{_final._slug(arm.name)}-{seed}.pt")
        return _run(seed, next(values[arm.name]))

    monkeypatch.setattr(_final, "_train", fake)
    monkeypatch.setattr(_final, "time", type("Clock", (), {"monotonic": staticmethod(lambda: clock[0])}))
    out = run_final(TinyTask(), _arm("defaults", 1e-2), [_arm("search #1", 3e-2)], _plan(seeds=3), store=None,
                    end=2.0, folder=tmp_path)  # type: ignore[arg-type]
    assert len(out.seeds) == 3
    solo = [r for r in out.arm("defaults").runs if r.seed not in out.seeds]
    assert len(solo) == _final.MAX_ROUNDS - 3
    assert out.comparison is not None
    assert out.comparison.extra["defaults_outside_race"] == len(solo)
    assert out.decision == "chosen"
    assert "more training(s) of the defaults alone" in out.note


def test_the_compute_stage_sizes_its_measurements_by_a_step_as_a_training_pays_it(
        optimize_run: dict[str, object]) -> None:
    # the profile's phases leave out the loop's own work around a step (at batch 4 the compute stage
    # then took 3x its share): the steps it gives each measurement are counted at the no-tricks
    # run's wall clock per step where that is longer
    state = json.loads((Path(str(optimize_run["out"])) / "state.json").read_text())
    baseline, compute = state["stages"]["baseline"]["outputs"], state["stages"]["compute"]
    task = TinyTask()
    steps_per_epoch = len(task.train_data(int(task.default_params["batch_size"]), dict(task.default_params)))
    wall_ms = baseline["epoch_s"] / steps_per_epoch * 1e3
    steps = compute["outputs"]["steps"]
    assert steps["step_ms"] >= wall_ms * (1 - 1e-9)
    assert steps["share_steps"] == pytest.approx(compute["share_s"] / (steps["step_ms"] / 1e3), rel=1e-6)
    assert steps["lr_range_test"] == int(min(100, max(10, 0.45 * steps["share_steps"])))


def _kept_best(tmp_path: Path) -> tuple[TinyTask, Arm, list[Any], Any]:
    """The task, the search's best, its kept model at the baseline's seed (trial 4, one epoch:
    fewer than the task's) and a stand-in loop that reads it, as the final stage's helpers do."""
    from types import SimpleNamespace

    from proftune.optimize._search_records import KeptRun

    task = TinyTask()
    (tmp_path / "search_models").mkdir()
    torch.save({"w": torch.ones(1)}, tmp_path / "search_models" / "trial-4.pt")
    best = Arm(name="search #1", params={**task.default_params, "lr": 3e-2}, source="search", epoch_s=1.0)
    kept = [KeptRun(trial=4, run_id=None, seed=0, val=0.9, epochs=1, duration_s=0.5, metrics={"accuracy": 0.9},
                    model="search_models/trial-4.pt", params=dict(best.params))]
    loop = SimpleNamespace(task=task, cfg=SimpleNamespace(seed=0), out=tmp_path, dev=torch.device("cpu"),
                           v=SimpleNamespace(metric="accuracy"),
                           state=SimpleNamespace(record=lambda _cls: SimpleNamespace(kept=kept)))
    return task, best, kept, loop


def test_where_no_training_of_the_best_fits_its_own_shorter_training_races(tmp_path: Path) -> None:
    """Trials at fewer epochs than the task's, and no time for one training of the search's best at
    the task's own: the race takes the search's own training of it (kept at the baseline's seed)
    as an arm at the trials' epochs, so the decision has a pair without training anything."""
    from proftune.optimize._reuse import short_finalist

    task, best, kept, loop = _kept_best(tmp_path)
    now = time.monotonic()
    short = short_finalist(loop, best, 1, now + 0.5)  # type: ignore[arg-type]
    assert short is not None
    assert short.epochs == 1
    assert short.name == "search #1 at 1 epochs"
    assert short_finalist(loop, best, 1, now + 60) is None  # a training at the task's own epochs fits
    assert short_finalist(loop, best, task.default_epochs, now) is None  # the trials ran the task's own
    kept[0] = dataclasses.replace(kept[0], seed=5)
    assert short_finalist(loop, best, 1, now) is None  # not at the baseline's seed: it would not pair


def test_a_best_whose_every_race_run_was_cut_races_again_as_the_searchs_own_shorter_training(tmp_path: Path) -> None:
    """The race kept the defaults only because the clock cut every run of the search's best at the
    task's own epochs (a busy machine): its own training at the trials' epochs (kept at the
    baseline's seed) races in its place. Not where a run of it finished, nor where the race chose."""
    from types import SimpleNamespace

    from proftune.optimize._reuse import cut_short

    task, best, kept, loop = _kept_best(tmp_path)
    cut = dataclasses.replace(_run(0, 0.89), cut=True)

    def outcome(decision: str, *runs: ArmRun) -> Any:
        return SimpleNamespace(decision=decision, arms=[_arm("defaults", 1e-3), dataclasses.replace(best, runs=runs)])

    short = cut_short(loop, outcome("defaults", cut), best, 1)  # type: ignore[arg-type]
    assert short is not None
    assert (short.name, short.epochs) == ("search #1 at 1 epochs", 1)
    assert cut_short(loop, outcome("defaults", cut, _run(101, 0.5)), best, 1) is None  # a run of it finished
    assert cut_short(loop, outcome("chosen", cut), best, 1) is None
    assert cut_short(loop, outcome("defaults"), best, 1) is None  # never raced: the time held no run of it
    assert cut_short(loop, outcome("defaults", cut), best, task.default_epochs) is None  # no shorter training
    kept[0] = dataclasses.replace(kept[0], seed=5)
    assert cut_short(loop, outcome("defaults", cut), best, 1) is None  # not at the baseline's seed


def test_the_cut_races_stand_in_trains_nothing_and_a_lead_far_beyond_noise_is_adopted(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # the second race after a cut one: the budget is spent, the defaults' first run is the baseline's
    # and the stand-in's is the search's own training of it; nothing trains, and a lead of 0.38 on
    # 300 validation samples (its search lead 0.62 over the defaults at the trials' epochs) is taken
    fake = _FakeTrain({})
    monkeypatch.setattr(_final, "_train", fake)
    for name in ("base.pt", "trial.pt"):
        torch.save({"w": torch.zeros(1)}, tmp_path / name)
    short = dataclasses.replace(_arm("search #1 at 11 epochs", 3e-2), epochs=11, search_mean=0.85, search_n=1)
    now = time.monotonic()
    out = run_final(None, _arm("defaults", 1e-3), [short], _plan(val_samples=300), store=None,  # type: ignore[arg-type]
                    end=now - 1, hard_end=now - 1, folder=tmp_path, first=(_run(0, 0.47), tmp_path / "base.pt"),
                    first_more=(_run(0, 0.85), tmp_path / "trial.pt"), search_lead=0.62)
    assert fake.calls == []
    assert (out.decision, out.chosen) == ("chosen", "search #1 at 11 epochs")
    assert (tmp_path / "model.pt").is_file()
