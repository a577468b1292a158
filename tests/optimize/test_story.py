"""What the result says in words: the defaults in effect, what counts as a change, and the
answers to a newcomer's questions for each way a run can end."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from proftune._holdout import HoldoutInfo
from proftune.optimize import (
    CompressOutputs,
    FinalSummary,
    ModelFigures,
    OptimizeResult,
    ParamChange,
    SeedSummary,
    SplitComparisons,
    SplitSummaries,
    StageRow,
    VsBaseline,
)
from proftune.optimize._changes import defaults_in_effect, optimizer_defaults, param_changes
from proftune.optimize._decide import Comparison
from proftune.optimize._story import method_name, tell
from proftune.train import build_optimizer

from .tasks import TinyTask


def _rows(params: dict[str, Any], **kw: Any) -> dict[str, dict[str, Any]]:
    base: dict[str, Any] = {"task_defaults": {"lr": 1e-3, "batch_size": 64, "optimizer": "adamw"},
                            "read_defaults": {"dropout": 0.0, "width": 16}, "computed": {"batch_size": 128},
                            "reasons": {"batch_size": "the largest batch under 1 GiB is 128"},
                            "fixed": {"grad_accumulation": 1}, "searched": "search trial 7 (tpe): accuracy 0.98"}
    return {r.param: r.to_dict() for r in param_changes(params, **{**base, **kw})}


def test_a_value_made_explicit_at_its_default_is_no_change() -> None:
    rows = _rows({"lr": 3e-3, "batch_size": 128, "optimizer": "adamw", "grad_accumulation": 1,
                  "weight_decay": 0.01, "precision": "fp32", "dropout": 0.0, "width": 24})
    assert {k for k, r in rows.items() if r["changed"]} == {"lr", "batch_size", "width"}
    assert rows["weight_decay"]["default"] == 0.01  # AdamW's when unset
    assert rows["weight_decay"]["default_from"] == "fit loop"
    assert rows["width"]["default_from"] == "task code"
    assert rows["batch_size"]["source"] == "computed"
    assert rows["batch_size"]["why"] == "the largest batch under 1 GiB is 128"
    assert rows["lr"]["source"] == "searched"
    assert rows["lr"]["why"].startswith("search trial 7")


def test_sgd_s_weight_decay_default_is_zero() -> None:
    assert defaults_in_effect({"optimizer": "sgd"}, {})["weight_decay"] == 0.0
    rows = _rows({"optimizer": "sgd", "weight_decay": 0.01}, task_defaults={"optimizer": "sgd"})
    assert rows["weight_decay"]["changed"]


class _OwnSGD(TinyTask):
    """A task whose own ``configure_optimizer`` builds SGD with momentum and no weight decay."""

    default_params: ClassVar[dict[str, Any]] = {"lr": 3e-4, "batch_size": 32}

    def configure_optimizer(self, model: torch.nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=float(params.get("lr", 3e-4)), momentum=0.9)


def test_the_defaults_shown_are_those_of_the_optimizer_the_task_builds() -> None:
    # issue 60: "weight decay 0.01 -> 0.00095" for a task whose own SGD leaves it at 0
    task = _OwnSGD()
    built = optimizer_defaults(task, dict(task.default_params))
    assert built == {"lr": 3e-4, "weight_decay": 0.0, "momentum": 0.9, "optimizer": "sgd"}
    rows = _rows({"lr": 3e-3, "batch_size": 32, "weight_decay": 0.00095, "momentum": 0.9},
                 task_defaults=dict(task.default_params), read_defaults={}, built=built)
    assert rows["weight_decay"]["default"] == 0.0
    assert rows["weight_decay"]["default_from"] == "task's optimizer"
    assert rows["weight_decay"]["changed"]
    assert rows["momentum"]["default"] == 0.9
    assert not rows["momentum"]["changed"]
    # the fit loop's own AdamW where the task builds none of its own
    assert optimizer_defaults(TinyTask(), {"lr": 1e-3})["weight_decay"] == 0.01


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
def test_the_defaults_in_effect_are_what_the_fit_loop_builds(name: str) -> None:
    """optimize's defaults in effect and the optimizer the loop builds from params that leave them
    out read one home (``_optimizers``): the lr, the weight decay and the momentum agree."""
    built = build_optimizer(torch.nn.Linear(2, 1).parameters(), {"optimizer": name}).param_groups[0]
    assumed = defaults_in_effect({"optimizer": name}, {})
    assert assumed["lr"] == built["lr"]
    assert assumed["weight_decay"] == built["weight_decay"]
    assert assumed["momentum"] == built.get("momentum", 0.0)
    assert defaults_in_effect({}, {})["optimizer"] == type(build_optimizer(torch.nn.Linear(2, 1).parameters(),
                                                                            {})).__name__.lower()


def _result(decision: str, **vs: Any) -> OptimizeResult:
    cmp = Comparison(metric="accuracy", maximize=True, split="val", seeds=[1, 2, 3], chosen=[], defaults=[], gain=0.04,
                     gain_std=0.01, lower=0.02, level=0.95, resolution=0.0, beyond_noise=decision == "chosen",
                     reason=("beyond noise: the 95% lower bound of the gain is +0.02 > 0" if decision == "chosen"
                             else "within noise: the 95% lower bound of the gain is -0.01"))
    compress = CompressOutputs(candidates=[ModelFigures(method="static", latency_ms=0.122, latency_batch_ms=1.05,
                                                        within_budget=True)])
    return OptimizeResult(
        task="t", study="s", run_id=1, out="o", objective="accuracy:max", budget_s=300.0, elapsed_s=183.2,
        stop_reason="the search ended early",
        stages=[StageRow(name="compress", outputs=compress.to_dict())],
        final=FinalSummary(seeds=[1, 2, 3], latency_ms=0.1135, latency_batch_ms=1.12, batch_size=64,
                           changes=[ParamChange(param="lr", default=1e-3, default_from="task", value=1e-3,
                                                changed=False, source="default")]),
        vs_baseline=VsBaseline(decision=decision, leader="search #1", metric="accuracy",
                               defaults=SplitSummaries(val=SeedSummary(mean=0.9611, std=0.004)),
                               final=SplitSummaries(val=SeedSummary(mean=0.9611)),
                               leader_vs_defaults=SplitComparisons(val=cmp),
                               held_out=HoldoutInfo(source="validation split", fraction=0.5, val_samples=180,
                                                    test_samples=180),
                               compression="kept the uncompressed model: no candidate is faster", **vs))


def test_kept_defaults_say_no_and_what_was_proposed() -> None:
    told = tell(_result("defaults", leader_changes=[ParamChange(param="lr", default=1e-3, default_from="task",
                                                                 value=3.2e-3, changed=True, source="searched")]))
    lines = {x.label: x.text for x in told.lines}
    assert told.adopted is False
    assert lines["did it help"].startswith("no, not beyond noise: accuracy gain +0.04 ± 0.01 over 3 paired seed(s); "
                                           "the 95% lower bound")
    assert lines["what changed"] == "nothing: the result is the task's defaults"
    assert lines["proposed, not adopted"] == "lr 0.001 -> 0.0032 (searched)"
    # no compressed model: the fastest candidate within the budget, slower at batch 1, faster at 64
    assert lines["compressed model faster"].startswith("no: kept the uncompressed model; the fastest candidate")
    assert "static INT8, runs 1.07x slower at batch 1 (0.114 ms -> 0.122 ms)" in lines["compressed model faster"]
    assert "1.07x faster at batch 64" in lines["compressed model faster"]
    assert lines["time"] == "183 s of the 300 s budget (61%)"
    assert lines["stopped"] == "the search ended early"


def test_a_compression_candidate_is_named_as_people_name_it() -> None:
    assert method_name(ModelFigures(method="structured+dynamic", ratio=0.5)) == "structured pruning 50% + dynamic INT8"
    assert method_name(ModelFigures(method="static", ratio=0.0)) == "static INT8"


def test_the_result_s_load_line_runs_from_any_folder(optimize_run: dict[str, Any], tmp_path: Any,
                                                    monkeypatch: Any) -> None:
    """It defines the params it uses and names the files by absolute path (it said
    ``build_model(params)`` with ``params`` undefined, and ``'model.pt'`` relative to the cwd)."""
    import torch

    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(optimize_run["result"]["final"]["load"], scope)
    saved = torch.load(optimize_run["out"] / "model.pt", weights_only=True)
    assert scope["params"] == optimize_run["result"]["final"]["params"]
    assert all(torch.equal(v, saved[k]) for k, v in scope["model"].state_dict().items())


def test_sentences_from_other_parts_are_rounded_but_versions_are_not() -> None:
    from proftune.optimize._story import rounded

    assert rounded("the mean gain -0.002778 is not a gain") == "the mean gain -0.00278 is not a gain"
    assert (rounded("costs only 0.7611 accuracy, lower bound +0.3211 > 0")
            == "costs only 0.761 accuracy, lower bound +0.321 > 0")
    assert rounded("torch 2.14.1, 0.5 and 12.5, 98%") == "torch 2.14.1, 0.5 and 12.5, 98%"


def test_a_finding_of_the_defaults_training_is_theirs_where_the_result_changed_its_param() -> None:
    """lr_too_high, found while the defaults trained, under a result that raised the lr 43x: said
    as the defaults' finding, with the change, not as the last word on the result."""
    from proftune.diagnose import Finding
    from proftune.optimize._changes import ParamChange
    from proftune.optimize._story import _defaults_finding

    w = Finding(cause="lr_too_high", severity="warning", fix="lower the lr", summary="the loss rose after a dip")
    lr = ParamChange(param="lr", default=0.001, default_from="task", value=0.043, changed=True, source="searched",
                     why="trial 3")
    text = _defaults_finding(w, [lr])
    assert text.startswith("warning about the defaults' training: lr_too_high")
    assert "the result changed lr 0.001 -> 0.043: the finding is the defaults', not the result's" in text
    kept = _defaults_finding(w, [])
    assert "the result changed" not in kept


def test_the_lr_line_says_why_the_result_s_lr_is_not_the_range_test_s() -> None:
    """Issue 63: `lr-find` and `recommend` picked lr 0.1 where `optimize` said its lr search found
    nothing. The story says, in one line, the range test's rate, why the search did not centre on it
    and where the result's lr came from."""
    import dataclasses

    from proftune.optimize import ComputeOutputs
    from proftune.optimize._computed import ComputedValues, LrCheck

    check = LrCheck(computed_lr=0.1, default_lr=1e-3, batch_size=64, seconds=2.0, metric="accuracy", maximize=True,
                    defaults_value=0.9, computed_value=0.1, defaults_steps=40, computed_steps=40, margin=0.005,
                    used=False)
    compute = ComputeOutputs(computed=ComputedValues(batch_size=64), steps={"lr_range_test": 45},
                             recommendations=[{"name": "lr", "value": 0.1, "reason": "LR range test ..."}],
                             lr_check=check)
    base = _result("defaults")
    result = dataclasses.replace(base, stages=[StageRow(name="compute", outputs=compute.to_dict()), *base.stages])
    lines = {x.label: x.text for x in tell(result).lines}
    assert lines["lr"] == ("the range test of `lr-find` and `recommend` (45 steps here, 100 there) computed 0.1 "
                           "at batch 64; a 2 s check trained no better with it than with the defaults' 0.001, so "
                           "the search centred on the defaults'; the result trains at 0.001 (the defaults' lr)")
    # a searched lr names the trial it came from
    searched = ParamChange(param="lr", default=1e-3, default_from="task", value=0.043, changed=True,
                           source="searched", why="search trial 3")
    result = dataclasses.replace(result, final=dataclasses.replace(result.final, changes=[searched]))
    lines = {x.label: x.text for x in tell(result).lines}
    assert lines["lr"].endswith("the result trains at 0.043 (found by the search: search trial 3)")
