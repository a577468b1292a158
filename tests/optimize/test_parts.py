"""Fast tests of the pieces the optimize loop rests on: durations, budget, flags, auto-stop, plan."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from torch import nn

from proftune._jsonsafe import json_dumps
from proftune._train_params import TrainParams
from proftune._units import parse_duration
from proftune.exceptions import ConfigError
from proftune.optimize import (
    OPTIMIZE_STAGES,
    SHARES,
    Budget,
    build_plan,
    find_flags,
    mean_ablation_hook,
)
from proftune.optimize._api import OptimizeResult
from proftune.optimize._computed import ComputedValues, OptimizerChoice
from proftune.optimize._output import write_summary
from proftune.optimize._records import (
    BaselineOutputs,
    CompressOutputs,
    ComputeOutputs,
    FinalOutputs,
    HealthOutputs,
    LayerValueOutputs,
    SearchStageOutputs,
    StageOutputs,
)
from proftune.optimize._result_records import FinalSummary, StageRow, VsBaseline
from proftune.optimize._search import StageSettings, groups_of, propose, stalled
from proftune.optimize._search_records import arm_of
from proftune.optimize._state import OptimizeState
from proftune.optimize._warm_start import WIDE_POINTS, by_success, space_point, warm_start, wide_points
from proftune.recommend import Recommendation, Recommendations
from proftune.search import TrialRecord, load_space

from .tasks import TinyTask


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), (90, 90.0), ("90s", 90.0), ("5m", 300.0),
                                               ("5min", 300.0), ("1h", 3600.0), ("250ms", 0.25)])
def test_parse_duration(text: Any, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["0", "-5m", "soon", "5 parsecs", True])
def test_parse_duration_refuses(text: Any) -> None:
    with pytest.raises(ConfigError, match=r"^budget=.* (is not a|must be a finite) duration"):
        parse_duration(text, name="budget")


def test_budget_shares_sum_within_the_total() -> None:
    b = Budget(100.0)
    shares = [b.stage_s(s) for s in OPTIMIZE_STAGES]
    # what each stage gets if all run at once: the shares of what is left, never above it
    assert shares[0] == pytest.approx(b.left_s * SHARES["baseline"] / sum(SHARES.values()), rel=1e-3)
    assert b.stage_s("compress") == pytest.approx(b.left_s, rel=1e-3)  # the last takes what is left
    spent = Budget(100.0, spent_s=90.0)
    assert spent.left_s < 10.0
    assert spent.stage_s("search") < 10.0


def _space() -> Any:
    return load_space({"params": {"lr": {"type": "float", "low": 1e-3, "high": 1.0, "log": True},
                                  "hidden": {"type": "int", "low": 4, "high": 32}}})


def _plan() -> Any:
    return build_plan(TinyTask(), {"lr": 0.01}, user_space=_space().to_dict(), max_batch=None, samples=None)


def _row(n: int, lr: float, state: str, value: float | None = None, **kw: Any) -> TrialRecord:
    """A search trial as ``proftune.search`` reports it (the stage reads these records as they are)."""
    return TrialRecord(number=n, state=state, params={"lr": lr, "hidden": 8 + n % 24},
                       values=[value] if value is not None else None,
                       metrics={"accuracy": value} if value is not None else {}, constraints={},
                       reason=kw.get("reason"), duration_s=1.0, steps=10, anomalies=kw.get("anomalies", []),
                       tags={"arm": kw.get("arm", "tpe")}, curve=[{"epoch": 0}, {"epoch": 1}])


def _nan(n: int, lr: float) -> TrialRecord:
    return _row(n, lr, "pruned", reason="non-finite values: {'kind': 'nan_loss'}",
                anomalies=[{"kind": "nan_loss"}])


def test_flag_covers_the_failing_region_and_not_the_good_one() -> None:
    rows = [_row(0, 0.01, "complete", 0.9), _row(1, 0.02, "complete", 0.91), _nan(2, 0.2), _nan(3, 0.5),
            _nan(4, 0.3)]
    flags = find_flags(rows, _plan(), flag_min=3)
    assert len(flags) == 1
    f = flags[0]
    assert f.cause == "nan"
    assert f.trials == [2, 3, 4]
    assert f.region["lr"] == {"low": 0.2, "high": 1.0}  # widened to the edge where nothing succeeded
    assert not f.contains({"lr": 0.02, "hidden": 10})
    assert f.contains({"lr": 0.7, "hidden": 10})
    assert find_flags(rows, _plan(), flag_min=4) == []  # fewer failures than the threshold


def test_no_flag_where_a_trial_succeeded_inside_the_region() -> None:
    rows = [_row(0, 0.01, "complete", 0.9), _nan(1, 0.2), _row(2, 0.3, "complete", 0.8), _nan(3, 0.5),
            _nan(4, 0.4)]
    assert find_flags(rows, _plan(), flag_min=3) == []


def test_failures_of_different_causes_are_not_pooled() -> None:
    rows = [_row(0, 0.01, "complete", 0.9), _nan(1, 0.2), _nan(2, 0.5),
            _row(3, 0.3, "failed", reason="ValueError: bad shape")]
    assert find_flags(rows, _plan(), flag_min=3) == []
    rows += [_row(4, 0.4, "failed", reason="ValueError: bad shape"),
             _row(5, 0.6, "failed", reason="ValueError: again")]
    (flag,) = find_flags(rows, _plan(), flag_min=3)
    assert flag.cause == "exception:ValueError"


def test_no_new_configuration_is_drawn_in_a_paused_region() -> None:
    plan = _plan()
    rows = [_row(0, 0.01, "complete", 0.9), _nan(1, 0.1), _nan(2, 0.5), _nan(3, 0.3)]
    flags = find_flags(rows, plan, flag_min=3)
    settings = StageSettings(objective="accuracy:max", metric="accuracy", maximize=True)
    drawn: list[dict[str, Any]] = []
    for i in range(6):
        rows_i = [*rows, *(_row(10 + j, 0.002 + 0.001 * j, "complete", 0.5) for j in range(i))]
        drawn += [dict(c.params) for c in propose(rows_i, plan, settings, flags, 10)]
    assert len(drawn) > 50
    (flag,) = flags
    assert flag.region["lr"]["low"] == pytest.approx(0.1)
    assert not any(flag.contains(c) for c in drawn)  # the paused region is never drawn
    assert any(c["lr"] >= 0.1 for c in drawn)  # ... though its lr range is, outside the region
    keys = [tuple(sorted(c.params.items())) for c in propose(rows, plan, settings, flags, 10)]
    assert len(keys) == len(set(keys))  # a chunk never repeats a configuration


def test_tpe_proposals_move_towards_the_good_region() -> None:
    """Every trial so far feeds TPE: with the good trials at low lr, most proposals land there."""
    plan = _plan()
    settings = StageSettings(objective="accuracy:max", metric="accuracy", maximize=True, seed=3)
    rng = np.random.default_rng(0)
    rows = []
    for n in range(30):
        lr = float(np.exp(rng.uniform(np.log(1e-3), np.log(1.0))))
        rows.append(_row(n, lr, "complete", 1.0 - abs(np.log10(lr) + 2.5) / 3))  # best at lr ~3e-3
    drawn = [c.params["lr"] for c in propose(rows, plan, settings, [], 20)]
    assert np.median(np.abs(np.log10(drawn) + 2.5)) < 0.6  # uniform draws would give ~0.75


def test_warm_start_is_the_computed_centre_the_defaults_and_a_local_design() -> None:
    plan = build_plan(TinyTask(), {"lr": 0.02, "batch_size": 64}, user_space=None, max_batch=None, samples=192)
    items = [(arm_of(i), i.params) for i in warm_start(plan, {"lr": 0.01, "batch_size": 32, "hidden": 16})]
    arms = [a for a, _ in items]
    assert arms[:2] == ["centre", "defaults"]
    assert items[0][1]["lr"] == pytest.approx(0.02)
    assert items[1][1]["lr"] == pytest.approx(0.01)
    assert items[1][1]["batch_size"] == 32  # the default space holds the task's default batch
    lrs = sorted(p["lr"] for a, p in items if a == "local" and p["batch_size"] == 64 and p["weight_decay"] == 0.01)
    assert lrs == [pytest.approx(0.02 / 3), pytest.approx(0.06)]
    assert any(a == "local" and p["batch_size"] == 32 for a, p in items)
    # the weight decay nothing measured (AdamW's 0.01): a hundredth of it, at the centre's lr and batch
    assert [p for a, p in items if a == "local" and p["weight_decay"] != 0.01] == [
        {**items[0][1], "weight_decay": pytest.approx(1e-4)}]
    # each local step is followed by a point over the whole space, WIDE_POINTS of them
    arms_after = arms[2:]
    assert arms_after[:8] == ["local", "wide"] * 4
    assert arms.count("wide") == WIDE_POINTS


def test_a_centre_that_is_the_defaults_measured_already_is_not_trained_again() -> None:
    # nothing computed moved the centre off the task's defaults, and the baseline measured them at
    # the trials' protocol (with_defaults=False): the first trial is not their repeat, and it is a
    # point over the space, not a 3x step around a centre nothing measured
    defaults = {"lr": 0.01, "batch_size": 32, "hidden": 16}
    plan = build_plan(TinyTask(), {}, user_space=None, max_batch=None, samples=192)
    assert arm_of(warm_start(plan, defaults)[0]) == "centre"
    items = [(arm_of(i), i.params) for i in warm_start(plan, defaults, with_defaults=False)]
    assert [a for a, _ in items][:4] == ["wide", "local", "wide", "local"]
    assert all(p != space_point(plan, plan.centre) for _, p in items)
    # a computed centre elsewhere is still the first trial
    moved = build_plan(TinyTask(), {"lr": 0.05}, user_space=None, max_batch=None, samples=192)
    assert arm_of(warm_start(moved, defaults, with_defaults=False)[0]) == "centre"



def test_a_prior_that_a_point_over_the_space_beat_gives_way_and_the_rest_follows_in_order() -> None:
    # the first chunk placed a point over the space, a local step and another point; the second
    # chunk gets what is left of each kind in its own order, and the prior's steps only while one of
    # its trials scored at least as well as every point over the space (PriorBand's weighting)
    defaults = {"lr": 0.01, "batch_size": 32, "hidden": 16}
    plan = build_plan(TinyTask(), {}, user_space=None, max_batch=None, samples=192)
    items = warm_start(plan, defaults, with_defaults=False)

    def placed(values: dict[str, float]) -> list[TrialRecord]:
        out, seen = [], {"wide": 0, "local": 0}
        for n, arm in enumerate(["wide", "local", "wide"]):
            item = [i for i in items if arm_of(i) == arm][seen[arm]]
            seen[arm] += 1
            row = _row(n, float(item.params["lr"]), "complete", values[arm], arm=arm)
            out.append(dataclasses.replace(row, params=dict(item.params)))
        return out
    left = [i for i in items if i not in items[:3]]
    assert by_success(items, placed({"wide": 0.5, "local": 0.9}), maximize=True) == left
    beaten = by_success(items, placed({"wide": 0.9, "local": 0.5}), maximize=True)
    assert beaten
    assert beaten == [i for i in left if arm_of(i) == "wide"]
    # a loss read the other way: the lower is the better
    assert by_success(items, placed({"wide": 0.9, "local": 0.5}), maximize=False) == left
    assert by_success(items, [], maximize=True) == list(items)

class _NoDecay(TinyTask):
    default_params: ClassVar[dict[str, Any]] = {**TinyTask.default_params, "optimizer": "sgd", "weight_decay": 0.0}


def test_a_task_s_own_decay_of_zero_is_the_centre_not_adamw_s() -> None:
    plan = build_plan(_NoDecay(), {"lr": 0.02}, user_space=None, max_batch=None, samples=192)
    p = plan.space.param("weight_decay")
    assert plan.centre["weight_decay"] == p.low == pytest.approx(1e-6)  # no decay to speak of, on a log scale
    low, high = plan.narrow["weight_decay"]
    assert p.low <= low < high <= p.high
    # and the warm start takes no hundredth of a decay the task chose to be none
    items = [(arm_of(i), i.params) for i in warm_start(plan, dict(_NoDecay.default_params))]
    assert all(q["weight_decay"] == pytest.approx(1e-6) for a, q in items if a in ("centre", "defaults", "local"))


class _FitLoopSgd(TinyTask):
    """The fit loop's SGD with no weight decay given: it applies none (SGD's default)."""

    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-2, "batch_size": 32, "optimizer": "sgd"}


def test_an_unset_decay_is_the_fit_loops_optimizers_not_adamws() -> None:
    plan = build_plan(_FitLoopSgd(), {"lr": 0.02}, user_space=None, max_batch=None, samples=192)
    assert plan.centre["weight_decay"] == plan.space.param("weight_decay").low == pytest.approx(1e-6)
    # AdamW's own default stays 0.01 where the task leaves it unset
    assert build_plan(TinyTask(), {"lr": 0.02}, user_space=None, max_batch=None,
                      samples=192).centre["weight_decay"] == pytest.approx(0.01)


def test_the_wide_points_spread_over_the_whole_space_on_each_param_s_scale() -> None:
    plan = build_plan(TinyTask(), {"lr": 0.02, "batch_size": 64}, user_space=None, max_batch=None, samples=192)
    lr = plan.space.param("lr")
    points = wide_points(plan, 16, seed=3)
    assert points == wide_points(plan, 16, seed=3)  # a seed draws the same points
    logs = sorted(math.log(p["lr"]) for p in points)
    lo, hi = math.log(lr.low), math.log(lr.high)
    # evenly over the log range: every quarter of it holds some (16 uniform draws miss one 1 time in 20)
    assert all(any(lo + q * (hi - lo) / 4 <= v <= lo + (q + 1) * (hi - lo) / 4 for v in logs) for q in range(4))
    assert len({p["batch_size"] for p in points}) >= 3
    assert all(plan.space.param(k).low <= v <= plan.space.param(k).high for p in points for k, v in p.items()
               if plan.space.param(k).type != "categorical")


def test_auto_stop_patience_grows_with_the_trials_run() -> None:
    s = StageSettings(objective="accuracy:max", metric="accuracy", maximize=True, patience=3, min_delta=0.01)
    rising = [_row(i, 0.01, "complete", 0.5 + 0.05 * i) for i in range(6)]
    assert stalled(rising, s) is None
    flat = [*rising, *(_row(6 + i, 0.01, "complete", 0.7) for i in range(3))]
    assert stalled(flat, s) is None  # 3 flat of 9: below half the trials
    flat += [_row(9 + i, 0.01, "complete", 0.7) for i in range(3)]
    why = stalled(flat, s)
    assert why is not None
    assert "auto-stop" in why
    assert "last 6 of 12" in why
    # pruned trials (no final value) do not count towards the patience
    assert stalled([*rising, *(_row(6 + i, 0.01, "pruned") for i in range(20))], s) is None
    # for a metric to minimise the same values are a steady fall, not a plateau
    s_min = StageSettings(objective="val_loss:min", metric="val_loss", maximize=False, patience=3)
    falling = [_row(i, 0.01, "complete", 1.0 - 0.1 * i) for i in range(8)]
    assert stalled(falling, s_min) is None


def test_groups_are_mean_and_std_over_seeds() -> None:
    rows = [_row(0, 0.01, "complete", 0.8), dataclasses.replace(_row(0, 0.01, "complete", 0.9), number=5),
            _row(1, 0.02, "complete", 0.95)]
    groups = groups_of(rows, maximize=True)
    assert groups[0].n == 1
    assert groups[0].mean == pytest.approx(0.95)
    two = next(g for g in groups if g.n == 2)
    assert two.mean == pytest.approx(0.85)
    assert two.std == pytest.approx(np.std([0.8, 0.9], ddof=1))
    assert two.trials == [0, 5]


def test_default_space_reads_the_task_and_centres_on_the_computed_values() -> None:
    plan = build_plan(TinyTask(), {"lr": 0.02, "batch_size": 64, "grad_accumulation": 1, "precision": "fp32"},
                      user_space=None, max_batch=64, samples=192)
    assert {"lr", "batch_size", "weight_decay", "dropout", "hidden"} <= set(plan.space.names)
    assert plan.centre["lr"] == pytest.approx(0.02)
    assert plan.centre["batch_size"] == 64
    assert max(plan.space.param("batch_size").choices) <= 64  # never above the memory's batch
    assert plan.space.fixed["precision"] == "fp32"
    assert plan.evidence["lr"].startswith("computed")


def test_a_small_training_set_can_be_searched_in_one_batch() -> None:
    """On 50 samples with a computed batch of 16 the whole set is a choice (capped there, never
    above it): few-shot digits trains best at one step an epoch, which a space up to 2x the
    computed batch never tried."""
    plan = build_plan(TinyTask(), {"lr": 0.01, "batch_size": 16, "grad_accumulation": 1, "precision": "fp32"},
                      user_space=None, max_batch=None, samples=50)
    choices = plan.space.param("batch_size").choices
    assert max(choices) == 50
    assert plan.centre["batch_size"] == 16
    # and no batch under a quarter of the task's own (32) or the one that leaves eight steps an
    # epoch (6): eight times its steps an epoch cost a small model eight times its training; a
    # computed batch under it stays (its cost was checked)
    assert TinyTask().default_params["batch_size"] == 32
    assert min(choices) == 6
    small = build_plan(TinyTask(), {"lr": 0.01, "batch_size": 4, "grad_accumulation": 1, "precision": "fp32"},
                       user_space=None, max_batch=None, samples=50)
    assert min(small.space.param("batch_size").choices) == 4
    # a default batch beyond the data (128 of 107 samples): the floor leaves eight steps an epoch,
    # where the centre moves (a floor of 32 left no choice there: the run crashed)
    big = TinyTask()
    big.default_params = {**big.default_params, "batch_size": 128}
    plan = build_plan(big, {"lr": 0.01, "batch_size": 128, "grad_accumulation": 1, "precision": "fp32"},
                      user_space=None, max_batch=None, samples=107)
    assert min(plan.space.param("batch_size").choices) <= 13
    assert plan.centre["batch_size"] <= 13


def test_a_roomy_budget_reaches_the_plain_loops_batches() -> None:
    """A task's own batch of 128 on 786 samples: six steps an epoch. At a few trainings the search's
    batches start at a quarter of it (32); where the budget holds many, a plain loop's from 16 are
    choices too (a 1-epoch CNN there learned only at 16), never under eight steps an epoch."""
    big = TinyTask()
    big.default_params = {**big.default_params, "batch_size": 128}
    computed = {"lr": 0.01, "batch_size": 128, "grad_accumulation": 1, "precision": "fp32"}
    few = build_plan(big, computed, user_space=None, max_batch=None, samples=786)
    many = build_plan(big, computed, user_space=None, max_batch=None, samples=786, roomy=True)
    assert min(few.space.param("batch_size").choices) == 32
    assert min(many.space.param("batch_size").choices) == 16
    assert many.centre == few.centre
    # on 100 samples eight steps an epoch is batch 12: the floor stays there
    tiny = build_plan(big, computed, user_space=None, max_batch=None, samples=100, roomy=True)
    assert min(tiny.space.param("batch_size").choices) == 12


def test_a_space_contradicting_computed_values_is_refused() -> None:
    space = {"params": {"lr": {"type": "float", "low": 1e-3, "high": 1.0, "log": True},
                        "batch_size": {"type": "categorical", "choices": [128, 256]}},
             "fixed": {"precision": "bf16"}}
    with pytest.raises(ConfigError) as err:
        build_plan(TinyTask(), {"precision": "fp32"}, user_space=space, max_batch=64, samples=None)
    assert err.value.problems == [  # the arguments the user gave (space=, memory_budget=): the CLI reads flags
        "space= fixes precision='bf16', but the compute stage measured precision='fp32'; remove it from "
        "the space or make them agree.",
        "space= batch_size starts at 128, above the largest batch that fits memory_budget= (64, measured)."]


def test_mean_ablation_hook_removes_the_sample_information() -> None:
    layer = nn.Linear(3, 2)
    layer.register_forward_hook(mean_ablation_hook)
    x = torch.randn(5, 3)
    out = layer(x)
    assert torch.allclose(out, out.mean(0, keepdim=True).expand_as(out))
    assert torch.allclose(out[0], (x @ layer.weight.T + layer.bias).mean(0), atol=1e-6)


def test_a_measured_better_optimizer_joins_the_space_and_the_warm_start() -> None:
    computed = {"lr": 0.01, "batch_size": 32,
                "optimizer_alternative": {"optimizer": "sgd", "lr": 0.2, "momentum": 0.9}}
    plan = build_plan(TinyTask(), computed, user_space=None, max_batch=None, samples=192)
    assert plan.space.param("optimizer").choices == ("adamw", "sgd")
    assert plan.space.param("lr").high >= 0.2 * 30 * 0.999
    assert "optimizer" not in plan.space.fixed
    items = [(arm_of(i), i.params) for i in warm_start(plan, {"lr": 0.01, "batch_size": 32, "optimizer": "adamw"},
                                                       OptimizerChoice.from_dict(computed["optimizer_alternative"]))]
    sgd = [p for a, p in items if p.get("optimizer") == "sgd" and a != "wide"]
    assert sgd == [{**sgd[0], "lr": pytest.approx(0.2), "momentum": pytest.approx(0.9)}]
    assert all("momentum" not in p for _, p in items if p.get("optimizer") == "adamw")


class _SlowEpochs(TinyTask):
    """TinyTask whose every batch waits 0.2 s: far slower than the epoch time it is planned with."""

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        for batch in super().train_data(batch_size, params):
            time.sleep(0.2)
            yield batch


def test_no_final_run_goes_on_past_the_budget_s_end_but_the_defaults_reference(tmp_path: Path) -> None:
    """A run may take up to three times its measured epochs (the race's time is spent, but a
    round that started finishes), yet never past the budget's end (``cap_end``): there it is cut.
    The one exception is the defaults' first training, the reference and the result when nothing
    beats it: a model cut before their own epochs would be less than the user had (issue 39), so
    it runs them, past the end, and the note says so."""
    from proftune.optimize._final import Arm, FinalPlan, run_final
    from proftune.track import Store

    plan = FinalPlan(metric="accuracy", maximize=True, epochs=5, seeds=1, seed=0, device="cpu", val_samples=96)
    defaults = Arm(name="defaults", params=dict(TinyTask.default_params), source="defaults", epoch_s=1.0)
    other = Arm(name="search #1", params={**TinyTask.default_params, "lr": 3e-2}, source="search", epoch_s=1.0)
    now = time.monotonic()
    out = run_final(_SlowEpochs(), defaults, [other], plan, store=Store(f"sqlite:///{tmp_path / 'p.db'}"),
                    end=now + 0.5, cap_end=now + 1.5, folder=tmp_path, notes=["said first"])
    (ref,) = out.arm("defaults").runs
    assert not ref.cut  # 5 epochs of 6 batches at >= 0.2 s each: at least 6 s, past the end
    assert ref.epochs == 5
    (run,) = out.arm("search #1").runs
    assert run.cut  # started after the end: cut there (after its first step)
    assert run.epochs < 5
    assert out.decision == "defaults"
    assert out.model_run() == ref
    assert out.note.startswith("said first")
    assert "s past the budget's end" in out.note


def _strict_json(path: Path) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"{path.name} holds {token}, which strict JSON parsers refuse")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_a_nan_metric_lands_as_null_in_state_and_summary(tmp_path: Path) -> None:
    """A diverged stage (NaN metric) leaves files any JSON parser reads, and the run resumes."""
    state = OptimizeState.load_or_new(tmp_path, {"task": "t", "study": "s", "objective": "accuracy:max",
                                                 "budget_s": 10.0})
    state.stages["baseline"] = {"status": "finished", "metric_after": math.nan,
                                "outputs": {"spread": math.inf, "defaults": {"metrics": {"accuracy": math.nan}}}}
    state.save()
    stored = _strict_json(tmp_path / "state.json")
    assert stored["stages"]["baseline"]["metric_after"] is None
    assert stored["stages"]["baseline"]["outputs"]["defaults"]["metrics"]["accuracy"] is None
    again = OptimizeState.load_or_new(tmp_path, {})
    assert again.finished("baseline")
    assert again.outputs("baseline")["spread"] is None
    result = OptimizeResult(task="t", study="s", run_id=1, out=str(tmp_path), objective="accuracy:max",
                            budget_s=10.0, elapsed_s=math.nan, stages=[StageRow(name="final", metric_after=math.nan)],
                            final=FinalSummary(mean=math.nan, std=math.inf), vs_baseline=VsBaseline(gain=-math.inf))
    write_summary(result, tmp_path)
    summary = _strict_json(tmp_path / "summary.json")
    assert (summary["final"]["mean"], summary["final"]["std"]) == (None, None)
    assert summary["stages"][0]["metric_after"] is None
    assert summary["elapsed_s"] is None
    assert summary["vs_baseline"]["gain"] is None


@pytest.mark.parametrize("kind", [BaselineOutputs, HealthOutputs, ComputeOutputs, LayerValueOutputs,
                                  SearchStageOutputs, FinalOutputs, CompressOutputs])
def test_stage_records_are_frozen_versioned_and_read_back(kind: type[StageOutputs]) -> None:
    empty = kind()
    d = empty.to_dict()
    assert d["schema_version"] == 1
    assert kind.from_dict(json.loads(json_dumps(d))) == empty  # through state.json and back
    with pytest.raises(dataclasses.FrozenInstanceError):
        empty.schema_version = 2  # type: ignore[misc]
    with pytest.raises(ConfigError, match="schema_version=99"):
        kind.from_dict({**d, "schema_version": 99})


def test_computed_values_read_the_recommendations_and_keep_their_json_shape() -> None:
    def recs(optimizer: str, params: dict[str, Any]) -> Recommendations:
        return Recommendations(items=(
            Recommendation("batch_size", 64, "memory", {"max_batch_size": 128}),
            Recommendation("lr", 0.004, "range test"), Recommendation("precision", "int4", "?"),
            Recommendation("optimizer", optimizer, "compared", {"params": params})))

    sgd = ComputedValues.from_recommendations(recs("sgd", {"optimizer": "sgd", "lr": 0.2, "momentum": 0.9}),
                                              own_optimizer="adamw")
    assert sgd.params() == {"batch_size": 64, "lr": 0.004}  # an unknown precision is not a computed value
    assert sgd.optimizer_alternative == OptimizerChoice(optimizer="sgd", lr=0.2, momentum=0.9)
    d = sgd.to_dict()
    assert d == {"batch_size": 64, "lr": 0.004, "optimizer_alternative": {"optimizer": "sgd", "lr": 0.2,
                                                                          "momentum": 0.9}}
    assert ComputedValues.from_dict(json.loads(json.dumps(d))) == sgd
    own = ComputedValues.from_recommendations(recs("adamw", {"optimizer": "adamw", "lr": 1e-3}),
                                              own_optimizer="adamw")
    assert own.optimizer_alternative is None  # the task's own optimizer won: nothing to add
    adam = ComputedValues.from_recommendations(recs("adam", {"optimizer": "adam", "lr": 3e-3}),
                                               own_optimizer="adamw")
    assert adam.to_dict()["optimizer_alternative"] == {"optimizer": "adam", "lr": 3e-3}  # no momentum key
    assert build_plan(TinyTask(), sgd, user_space=None, max_batch=None, samples=192).space.param(
        "optimizer").choices == ("adamw", "sgd")


def test_a_state_json_written_before_records_resumes() -> None:
    """Outputs without ``schema_version`` (state.json of an earlier proftune) read as records."""
    old = {"computed": {"lr": 0.01, "batch_size": 64}, "max_batch_size": 512, "run_id": 3,
           "steps": {"lr_range_test": 10}, "recommendations": [{"name": "lr", "value": 0.01, "reason": "range test"}]}
    comp = ComputeOutputs.from_dict(old)
    assert comp.computed.lr == 0.01
    assert comp.computed.batch_size == 64
    assert comp.computed.precision is None  # not computed: the task's own
    assert comp.max_batch_size == 512
    assert comp.reasons() == {"lr": "range test"}
    assert comp.to_dict() == {**old, "schema_version": 1}
    skipped = CompressOutputs.from_dict({"skipped": "--goal none"})
    assert skipped.to_dict() == {"schema_version": 1, "skipped": "--goal none"}  # its keys, no empty fields
    assert SearchStageOutputs.from_dict({"plan": {"space": {"fixed": {"epochs": 2}}}}).fixed() == {"epochs": 2}
    baseline = BaselineOutputs.from_dict({"no_tricks": {"metrics": {"accuracy": 0.5}}})
    assert baseline.metric("no_tricks", "accuracy") == 0.5


def test_optimize_reads_the_study_through_search_s_public_api_only() -> None:
    """The search stage's trials come from ``proftune.search`` (``study_trials``, ``cancel_waiting``,
    ``SearchResult``): optimize opens no Optuna storage of its own (search's has the SQLite pragmas
    and the retry) and reads no user attrs; one class is named ``SearchSettings``."""
    import re

    src = Path(__file__).resolve().parents[2] / "src" / "proftune"
    own = {p.name: p.read_text() for p in (src / "optimize").glob("*.py")}
    for name, text in own.items():
        assert not re.search(r"RDBStorage|open_storage|load_study|storage=|user_attrs|search\._", text), name
    assert "study_trials(" in own["_search.py"]
    assert "cancel_waiting(" in own["_search.py"]
    defined = [p for p in src.rglob("*.py") if re.search(r"^class SearchSettings\b", p.read_text(), re.M)]
    assert [p.relative_to(src).as_posix() for p in defined] == ["search/_settings.py"]


def test_a_stage_block_of_state_json_is_a_typed_record_checked_on_load(tmp_path: Path) -> None:
    """state.json's stage blocks read back as StageStatus; an unknown status or field is refused
    before anything is written, naming the stage and what is valid."""
    from proftune.exceptions import ProblemCollector
    from proftune.optimize._state import STATE_FILE, StageStatus, check_out_dir

    good = StageStatus(status="finished", duration_s=1.5, share_s=2.0, run_id=3, outputs={"x": 1})
    assert StageStatus.from_dict(good.to_dict()) == good
    out = tmp_path / "out"
    out.mkdir()
    state = {"version": 1, "task": "tiny", "study": "s", "stages": {"baseline": good.to_dict(),
                                                                     "search": {"status": "half-done"}}}
    (out / STATE_FILE).write_text(json.dumps(state))
    problems = ProblemCollector()
    assert check_out_dir(out, resume=True, study=None, task="tiny", problems=problems) is None
    text = " ".join(problems.problems)
    assert "the search stage's status in state.json: status='half-done' is unknown" in text
    assert "valid: finished, skipped, failed" in text
    with pytest.raises(ConfigError, match="the search stage's status"):
        OptimizeState.load_or_new(out, {})
    state["stages"]["search"] = {"status": "finished", "secs": 1}
    (out / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(ConfigError, match="secs"):
        OptimizeState.load_or_new(out, {})
    assert sorted(p.name for p in out.iterdir()) == [STATE_FILE]


def test_the_lr_range_without_a_measured_rate_spans_three_decades_each_way() -> None:
    """A task's rate 1000x too small is in the space when the range test gave no rate (a busy
    machine's compute stage may have had no time for it); a measured rate keeps its 30x."""
    measured = build_plan(TinyTask(), {"lr": 0.02}, user_space=None, max_batch=None, samples=192)
    lr = measured.space.to_dict()["params"]["lr"]
    assert (lr["low"], lr["high"]) == (pytest.approx(0.01 / 30 * 2), pytest.approx(0.6))
    unmeasured = build_plan(TinyTask(), {}, user_space=None, max_batch=None, samples=192)
    lr = unmeasured.space.to_dict()["params"]["lr"]  # around the task's 1e-2, bounded to [1e-6, 3]
    assert (lr["low"], lr["high"]) == (pytest.approx(1e-5), pytest.approx(3.0))


def test_a_batch_beyond_the_data_still_leaves_batches_of_many_steps_to_search() -> None:
    """Defaults at batch 8192 on 3,196 samples: the space's batches an eighth to eight times it
    were all one or two steps an epoch; a batch of eight and of 32 steps an epoch is a choice too."""
    plan = build_plan(TinyTask(), {"lr": 0.01, "batch_size": 8192, "grad_accumulation": 1, "precision": "fp32"},
                      user_space=None, max_batch=None, samples=3196)
    choices = plan.space.param("batch_size").choices
    assert 3196 // 8 in choices
    assert 3196 // 32 in choices
    assert max(choices) == 3196


def test_the_space_holds_the_common_batches_and_its_centre_leaves_eight_steps_an_epoch() -> None:
    """A default batch beyond the data (4096 on 1,097 samples, capped there: one step an epoch) is
    no centre: it moves to the largest batch that leaves eight steps (the whole set stays a choice),
    and the space holds the batches a plain loop searches (its best was 32) whatever the centre."""
    from proftune.optimize._search_plan import COMMON_BATCHES

    plan = build_plan(TinyTask(), {"batch_size": 1097}, user_space=None, max_batch=None, samples=1097)
    choices = plan.space.param("batch_size").choices
    assert set(COMMON_BATCHES) <= set(choices)
    assert plan.centre["batch_size"] <= 1097 // 8
    assert plan.centre["batch_size"] == max(c for c in choices if c <= 1097 // 8)
    assert max(choices) == 1097


def test_the_training_samples_are_counted_not_bounded_by_a_batch_beyond_the_data() -> None:
    """batches x batch size gave 4096 for a batch of 4096 on 1,097 samples: the space's batches then
    never went below 128."""
    from proftune.optimize._stage_measures import train_samples

    from .tasks import X_TRAIN

    assert train_samples(TinyTask(), TrainParams.of(TinyTask(), batch_size=4096)) == len(X_TRAIN)
    assert train_samples(TinyTask(), TrainParams.of(TinyTask(), batch_size=7)) == len(X_TRAIN)


def test_across_chunks_only_the_best_trials_models_stay_on_disk(tmp_path: Path) -> None:
    """Each chunk's runner keeps its own best models; the stage keeps the KEPT_MODELS best of all
    (every chunk's three models of a large model would fill the disk)."""
    from proftune.optimize._search import KEPT_MODELS, _drop_kept

    values = [0.5, 0.9, 0.7, 0.95, 0.6, 0.8]
    for n in range(len(values)):
        torch.save({"w": torch.zeros(1)}, tmp_path / f"trial-{n}.pt")
    rows = [_row(n, 0.01, "complete", v) for n, v in enumerate(values)] + [_row(6, 0.01, "pruned")]
    _drop_kept(tmp_path, rows, maximize=True)
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == ["trial-1.pt", "trial-3.pt", "trial-5.pt"]
    assert KEPT_MODELS == 3
    _drop_kept(tmp_path, rows, maximize=False)  # a loss: the lowest three
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == []  # none of the kept three is among them
