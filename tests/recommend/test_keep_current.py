"""The rule of every recommendation: a value whose own measured effect is worse than the current
one, or whose measurement is inconclusive, is not recommended; the current value is kept and the
row says why and what would decide it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import proftune
from proftune.recommend import MeasuredEffect, Recommendation, keep_unless_better
from proftune.recommend import _embedding as embedding
from proftune.recommend._ddp import ddp_recommendation, plan_ddp_batch
from proftune.recommend._embedding import EmbeddingConfig, recommend_embedding_dim
from proftune.recommend._optimizer import (
    OptimizerComparison,
    OptimizerTrial,
    optimizer_recommendation,
)

from .test_ddp import _scaling
from .test_embedding import RatingsMF

CPU = torch.device("cpu")
DIMS = {"users": 16, "items": 16}


def _row(value: object = 4) -> Recommendation:
    return Recommendation("embedding_dim", value, "measured: x.", {"params_to_set": {"dim": 4}}, "medium",
                          "fewer params")


@pytest.mark.parametrize(("proposed", "kept"), [(0.40, True), (0.497, False), (0.55, False), (float("nan"), True)])
def test_the_helper_keeps_the_current_value_only_when_the_proposal_measured_worse(proposed: float, kept: bool) -> None:
    effect = MeasuredEffect("accuracy", 0.5, proposed, True, tie=0.005)
    out = keep_unless_better(_row(), 16, effect=effect)
    assert (out.value == 16) is kept
    if kept:
        assert out.confidence == "low"
        assert out.evidence["kept_current"] == "measured worse"
        assert out.evidence["proposed"] == 4
        assert out.evidence["params_to_set"] == {}  # nothing of the proposal is to be set
        assert out.evidence["proposed_params"] == {"dim": 4}
        assert "keep the current value 16, not 4" in out.reason
        assert "0.5 at the current value" in out.reason
    else:
        assert out is not None
        assert out.value == 4


def test_an_inconclusive_measurement_keeps_the_current_value_and_says_what_would_decide() -> None:
    better = MeasuredEffect("accuracy", 0.5, 0.6, True)
    out = keep_unless_better(_row(), 16, effect=better, inconclusive="a training hit its time budget",
                             would_decide="embedding_budget_s=300")
    assert out.value == 16
    assert out.evidence["kept_current"] == "inconclusive"
    assert "inconclusive: a training hit its time budget" in out.reason
    assert "What would decide it: embedding_budget_s=300." in out.reason


def test_recommend_keeps_the_widths_when_the_time_budget_is_too_short_to_train() -> None:
    task = RatingsMF()
    recs = proftune.recommend(task, device="cpu", lr_steps=20, noise_steps=3, optimizer_budget_s=0,
                              embedding_budget_s=0.02)
    row = recs.get("embedding_dim")
    assert row.value == DIMS, row.reason
    assert row.evidence["kept_current"] == "inconclusive"
    assert "hit the time budget" in row.reason
    assert "embedding_budget_s=" in row.evidence["would_decide"]
    # the budget it names holds two trainings of the task's epochs at the pace measured here
    need = int(row.evidence["would_decide"].split("embedding_budget_s=")[1].split()[0])
    assert need > 0.02


def test_a_table_whose_trained_spectrum_is_noise_keeps_its_width() -> None:
    task = RatingsMF()
    # at this rate the tables stay as initialised (random): nothing above the noise floor
    params = {**task.default_params, "lr": 1e-9}
    row = recommend_embedding_dim(task, params, device=CPU, config=EmbeddingConfig(budget_s=60.0, max_epochs=2))
    assert row is not None
    assert row.value == DIMS, row.reason
    assert row.evidence["tables"]["users"]["signal_rank"] == 0
    assert row.evidence["kept_current"] == "inconclusive"
    assert "0 singular values above the noise floor" in row.reason
    assert row.evidence["would_decide"]


def test_a_width_whose_retrained_model_is_worse_is_not_recommended(monkeypatch: pytest.MonkeyPatch) -> None:
    task = RatingsMF()
    real = embedding.plan_table
    # a plan far below the data's rank 3: the retrained model must be worse, and the row must say so
    monkeypatch.setattr(embedding, "plan_table", lambda *a: dataclasses.replace(real(*a), new_dim=1))
    row = recommend_embedding_dim(task, dict(task.default_params), device=CPU, config=EmbeddingConfig(budget_s=60.0))
    assert row is not None
    assert row.value == DIMS, row.reason
    effect = row.evidence["measured_effect"]
    assert effect["proposed"] > effect["current"] + effect["tie"]  # val_loss: lower is better
    assert row.evidence["kept_current"] == "measured worse"
    assert row.evidence["proposed"] == {"users": 1, "items": 1}
    assert row.evidence["params_to_set"] == {}


def _trial(name: str, loss: float) -> OptimizerTrial:
    return OptimizerTrial(optimizer=name, params={"optimizer": name, "lr": 0.1}, lr_from="test", steps=20,
                          samples=640, time_s=1.0, val_loss=loss, metrics={"val_loss": loss}, stopped_by="budget",
                          batch_losses=[loss + d for d in (-0.01, 0.0, 0.01, 0.0)])


def _comparison(choice: str, trials: list[OptimizerTrial], **kw: object) -> OptimizerComparison:
    return OptimizerComparison(choice=choice, current="adamw", trials=trials, noise={}, budget_s=4.0, share_s=1.0,
                               spent_s=2.0, reason="test", **kw)  # type: ignore[arg-type]


def test_the_optimizer_row_never_names_one_that_measured_worse_or_was_not_compared() -> None:
    worse = optimizer_recommendation(_comparison("sgd", [_trial("adamw", 0.5), _trial("sgd", 0.8)]))
    assert worse.value == "adamw"
    assert worse.evidence["kept_current"] == "measured worse"
    better = optimizer_recommendation(_comparison("sgd", [_trial("adamw", 0.8), _trial("sgd", 0.5)]))
    assert better.value == "sgd"
    unmeasured = optimizer_recommendation(_comparison(
        "sgd", [_trial("sgd", 0.5)], skipped=[{"optimizer": "adamw", "why": "its range test gave no rate"}]))
    assert unmeasured.value == "adamw"
    assert unmeasured.evidence["kept_current"] == "inconclusive"
    assert "its range test gave no rate" in unmeasured.reason
    none = optimizer_recommendation(_comparison("adamw", []))
    assert none.value == "adamw"
    assert "optimizer_budget_s" in none.reason


def test_a_ddp_batch_predicted_slower_keeps_the_current_batch() -> None:
    s = _scaling()
    plan = plan_ddp_batch(s, current=32)
    assert plan.batch_size != 32
    slower = dataclasses.replace(plan, predicted_throughput=0.5 * plan.current_throughput)
    row = ddp_recommendation(s, slower, lr=0.1, optimizer="sgd", critical_batch=None)
    assert row.value == 32
    assert row.evidence["kept_current"] == "measured worse"
