"""The records of the race and of the result read back from their JSON, built by hand (no
training; a real run's records are read back in test_page.py): round trips, NaN, a renamed
field, a newer version."""

from __future__ import annotations

import json
import math

import pytest

from proftune._jsonsafe import json_dumps
from proftune.exceptions import ConfigError
from proftune.optimize import (
    FinalOutputs,
    FinalSummary,
    OptimizeResult,
    ParamChange,
    SearchStageOutputs,
    StageRow,
    VsBaseline,
)
from proftune.optimize._decide import compare_paired
from proftune.optimize._final import Arm, ArmRun, FinalOutcome, FinalPlan
from proftune.optimize._search import ConfigGroup, TrialLog, YellowFlag


def _json(d: object) -> dict:
    return json.loads(json_dumps(d))


def _race() -> FinalOutcome:
    def runs(vals: list[float | None]) -> tuple[ArmRun, ...]:
        return tuple(ArmRun(seed=100 + i, run_id=i, val=v, test=None if v is None else v - 0.01, epochs=2,
                            duration_s=0.5, cut=False, val_metrics={"accuracy": math.nan if v is None else v})
                     for i, v in enumerate(vals))

    defaults = Arm(name="defaults", params={"lr": 1e-5}, source="the task's defaults", runs=runs([0.4, 0.5, 0.45]))
    leader = Arm(name="search #1", params={"lr": 0.1}, source="search trials [3]", search_mean=0.93, search_n=1,
                 runs=runs([0.9, 0.92, None]))
    seeds = [100, 101, 102]
    cmp = compare_paired(leader.values("val", seeds), defaults.values("val", seeds), seeds=seeds, metric="accuracy",
                         maximize=True)
    plan = FinalPlan(metric="accuracy", maximize=True, epochs=2, seeds=3, seed=0, device="cpu", val_samples=47)
    return FinalOutcome(plan=plan, arms=[defaults, leader], seeds=seeds, decision="chosen", chosen="search #1",
                        leader="search #1", comparison=cmp, comparison_test=None, model_seed=101, note="")


def test_the_race_round_trips_with_its_gap_and_a_run_without_a_value() -> None:
    race = _race()
    stored = _json(race.to_dict())
    assert stored["search_gap"]["arm"] == "search #1"
    again = FinalOutcome.from_dict(stored)
    assert again.to_dict() == stored
    assert again.arm("search #1").runs[2].val_metrics == {"accuracy": None}  # a NaN metric is null in JSON
    assert again.arm("search #1").summary("val").n == 2  # a run without a value stays out of the figures
    assert again.search_gap() == race.search_gap()
    with pytest.raises(ConfigError, match="seed_list is not a field"):
        FinalOutcome.from_dict({**stored, "seed_list": stored["seeds"]})
    with pytest.raises(ConfigError, match="newer"):
        FinalOutcome.from_dict({**stored, "schema_version": 3})
    # a race recorded before issue 60 (version 1, no estimate) reads as it was
    old = {k: v for k, v in stored.items() if k != "estimate"}
    assert FinalOutcome.from_dict({**old, "schema_version": 1}).estimate is None
    final = FinalOutputs(race=race, metric=race.arm("search #1").summary("val"))
    assert FinalOutputs.from_dict(_json(final.to_dict())).to_dict() == _json(final.to_dict())


def test_the_search_stage_holds_its_groups_flags_and_trials_as_records() -> None:
    srch = SearchStageOutputs(best=ConfigGroup(params={"lr": 0.1}, values=[0.9], trials=[3], arms=["tpe"], mean=0.9,
                                               std=None, n=1),
                              flags=[YellowFlag(cause="nan", trials=[4, 5], region={"lr": {"low": 0.5, "high": 1.0}},
                                                evidence=["trial 4: lr=0.7 -> nan"])],
                              trials_log=[TrialLog(number=3, state="complete", value=0.9)])
    stored = _json(srch.to_dict())
    assert stored["flags"][0]["action"] == YellowFlag.action  # said in the JSON, not a field
    assert SearchStageOutputs.from_dict(stored) == srch
    with pytest.raises(ConfigError, match="score is not a field"):
        SearchStageOutputs.from_dict({**stored, "trials_log": [{"number": 3, "state": "complete", "score": 0.9}]})
    with pytest.raises(ConfigError, match=r"search stage's outputs.*why_stopped is not a field"):
        SearchStageOutputs.from_dict({**stored, "why_stopped": "auto-stop"})  # a renamed stage field
    older = _json(FinalOutputs(metric=_race().arm("defaults").summary("val")).to_dict())
    older["metric"]["name"] = "accuracy"  # a state.json of an older proftune
    assert FinalOutputs.from_dict(older).metric.n == 3


def test_an_optimize_result_round_trips_and_names_a_renamed_field() -> None:
    change = ParamChange(param="lr", default=1e-5, default_from="task", value=0.1, changed=True, source="searched",
                         why="search trial 3")
    res = OptimizeResult(task="t", study="s", run_id=1, out="o", objective="accuracy:max", budget_s=60.0,
                         elapsed_s=42.0, stages=[StageRow(name="final", status="finished", outputs={"chosen": "x"})],
                         final=FinalSummary(params={"lr": 0.1}, changes=[change]),
                         vs_baseline=VsBaseline(decision="chosen", leader="search #1", leader_changes=[change]))
    stored = _json(res.to_dict())
    assert OptimizeResult.from_dict(stored) == res
    assert res.stages[0].record(FinalOutputs).chosen == "x"
    with pytest.raises(TypeError, match=r"stage 'final' holds .* not SearchStageOutputs \(the 'search' stage's\)"):
        res.stages[0].record(SearchStageOutputs)
    renamed = {**stored, "final": {**stored["final"], "changes": [{**stored["final"]["changes"][0], "reason": "x"}]}}
    with pytest.raises(ConfigError, match=r"a param change.*reason is not a field"):
        OptimizeResult.from_dict(renamed)
    legacy = {k: v for k, v in stored.items() if k != "schema_version"}  # before records had a version
    assert OptimizeResult.from_dict(legacy) == res
