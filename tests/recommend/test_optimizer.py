"""The ``optimizer`` row: an equal-time comparison of AdamW, SGD+momentum and full-batch L-BFGS."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import proftune
from proftune.examples import TensorBatches
from proftune.profile import MemoryProfile, Profile, StepProfile
from proftune.recommend import OptimizerEvidence
from proftune.recommend._lr_find import run_lr_range_test
from proftune.recommend._optimizer import (
    KEEP_TOLERANCE,
    CompareConfig,
    OptimizerTrial,
    _choose,
    compare_optimizers,
    gradient_noise,
)
from proftune.train import TrainParams


class IllConditionedRegression(proftune.Task):
    """Least squares on 400 samples whose 20 features span scales 1..10 (condition ~100): a small,
    deterministic, badly conditioned problem, where a quasi-Newton method is far ahead of
    first-order ones in the same time."""

    name = "ill-conditioned-regression"
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-3, "batch_size": 32, "optimizer": "adamw"}

    def _data(self) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        scales = torch.logspace(0, 1, 20)
        x = torch.randn(500, 20, generator=gen) * scales
        w = torch.randn(20, 1, generator=gen)
        return x, (x @ w).squeeze(-1) + 0.01 * torch.randn(500, generator=gen)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Linear(20, 1)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y = self._data()
        return TensorBatches(x[:400], y[:400], batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        x, y = self._data()
        return TensorBatches(x[400:], y[400:], batch_size, shuffle=False)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x).squeeze(-1), y)


def _profile(step_ms: float, batch: int) -> Profile:
    return Profile(task="t", device="cpu", batch_size=batch, mode="train", steps=3,
                   memory=MemoryProfile(params_bytes=84, grads_bytes=84, optimizer_bytes=168, peak_bytes=40_000),
                   step=StepProfile(time_ms=step_ms, data_ms=0.05, forward_ms=step_ms / 3,
                                    backward_ms=step_ms / 3, optimizer_ms=0.1, throughput=batch / step_ms * 1e3))


def test_full_batch_lbfgs_wins_a_small_ill_conditioned_least_squares() -> None:
    task = IllConditionedRegression()
    params = dict(task.default_params)
    # the share is given: steps follow from the profile's step time, whatever the machine's load
    cfg = CompareConfig(share_s=0.25, batch_size=32, lr_steps=50, noise_batches=8)
    step_ms = 0.5
    comp = compare_optimizers(task, params, profile=_profile(step_ms, 32), device=torch.device("cpu"), config=cfg)
    names = {t.optimizer for t in comp.trials}
    assert names == {"adamw", "sgd", "lbfgs"}, comp.skipped
    lbfgs = comp.trial("lbfgs")
    assert lbfgs is not None
    assert lbfgs.params["batch_size"] == 400  # the whole training set in one batch
    assert comp.choice == "lbfgs", comp.reason
    adamw = comp.trial("adamw")
    assert adamw is not None
    assert lbfgs.val_loss < 0.5 * adamw.val_loss
    # equal budget: AdamW and SGD run the steps the share allows at the profile's step time
    sgd = comp.trial("sgd")
    assert sgd is not None
    assert sgd.steps == adamw.steps == int(0.25 * 1e3 / step_ms)
    assert 1 <= lbfgs.steps <= 2
    # each at its own range-test rate
    assert adamw.params["lr"] != sgd.params["lr"]
    assert sgd.params["momentum"] == pytest.approx(0.9)
    # the curves are evidence: a falling training loss, samples counted
    assert adamw.curve[-1]["loss"] < adamw.curve[0]["loss"]
    assert adamw.curve[-1]["samples"] == adamw.samples
    assert {"noise_to_signal", "kurtosis", "norm_max_over_median"} <= set(comp.noise)


def test_lbfgs_is_skipped_with_the_reason_when_a_full_batch_does_not_fit_the_memory() -> None:
    task = IllConditionedRegression()
    cfg = CompareConfig(share_s=0.05, batch_size=32, lr_steps=50, noise_batches=4, memory_budget=10_000)
    comp = compare_optimizers(task, dict(task.default_params), profile=_profile(0.5, 32),
                              device=torch.device("cpu"), config=cfg)
    assert comp.trial("lbfgs") is None
    (skip,) = [s for s in comp.skipped if s["optimizer"] == "lbfgs"]
    assert "full batch of 400 samples" in skip["why"]


def test_too_small_a_budget_keeps_the_task_optimizer_and_says_why() -> None:
    task = IllConditionedRegression()
    cfg = CompareConfig(budget_s=0.001, batch_size=32, lr_steps=5, noise_batches=4)
    comp = compare_optimizers(task, dict(task.default_params), profile=_profile(50.0, 32),
                              device=torch.device("cpu"), config=cfg)
    assert comp.choice == "adamw"
    assert comp.trials == []
    assert "raise the optimizer budget" in comp.reason


def _t(name: str, val: float, batches: tuple[float, ...] = ()) -> OptimizerTrial:
    return OptimizerTrial(optimizer=name, params={"optimizer": name}, lr_from="", steps=10, samples=100,
                          time_s=1.0, val_loss=val, metrics={}, stopped_by="budget",
                          curve=[{"step": 1.0, "samples": 10.0, "loss": 2.0, "time_s": 0.1}],
                          batch_losses=list(batches))


def test_the_task_optimizer_is_kept_unless_beaten_beyond_the_tolerance_and_the_noise() -> None:
    assert _choose([_t("adamw", 1.0), _t("sgd", 0.5)], "adamw")[0] == "sgd"
    close = 1.0 * (1 - KEEP_TOLERANCE / 2)
    assert _choose([_t("adamw", 1.0), _t("sgd", close)], "adamw")[0] == "adamw"
    # 10% lower on average, but one batch better and two worse: within the paired noise
    mine, other = (1.0, 1.0, 1.0), (0.4, 1.2, 1.1)
    assert _choose([_t("adamw", 1.0, mine), _t("sgd", 0.9, other)], "adamw")[0] == "adamw"
    # 10% lower on every batch: beyond noise
    assert _choose([_t("adamw", 1.0, mine), _t("sgd", 0.9, (0.91, 0.9, 0.89))], "adamw")[0] == "sgd"
    # a diverged current optimizer loses to any finite one
    assert _choose([_t("sgd", math.inf), _t("adamw", 0.3)], "sgd")[0] == "adamw"
    assert _choose([_t("sgd", math.inf)], "sgd")[0] == "sgd"


class _Heavy(IllConditionedRegression):
    """Targets with Student-t (2 degrees of freedom) noise: heavy-tailed gradient noise."""

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(4000, 20, generator=gen)
        t = torch.distributions.StudentT(1.5).sample((4000,))
        return TensorBatches(x, t, batch_size, shuffle=False)


def test_gradient_noise_kurtosis_separates_heavy_tails_from_gaussian_noise() -> None:
    params = TrainParams(batch_size=8)
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    heavy = gradient_noise(_Heavy(), params, batch_size=8, batches=64, device=cpu)
    light = gradient_noise(IllConditionedRegression(), params, batch_size=8, batches=40, device=cpu)
    assert heavy["kurtosis"] > 3.0 > light["kurtosis"], (heavy, light)
    assert heavy["norm_max_over_median"] > light["norm_max_over_median"]


def test_recommend_gives_the_optimizer_row_with_its_evidence_and_skips_it_at_zero_budget() -> None:
    task = IllConditionedRegression()
    recs = proftune.recommend(task, profile=_profile(0.5, 32), device="cpu", lr_steps=50, noise_steps=5,
                              optimizer_budget_s=2.0)
    row = recs.get("optimizer")
    assert row.value in ("adamw", "sgd", "lbfgs")
    assert row.evidence["params"]["optimizer"] == row.value
    chosen = OptimizerEvidence.of(row)  # the typed view optimize reads
    assert chosen.optimizer == row.value
    assert chosen.params == row.evidence["params"]
    assert {"trials", "noise", "budget_s", "share_s", "skipped"} <= set(row.evidence)
    assert row.evidence["budget_s"] == 2.0
    skipped = proftune.recommend(task, profile=_profile(0.5, 32), device="cpu", lr_steps=20, noise_steps=5,
                                 optimizer_budget_s=0)
    assert skipped.get("optimizer").value == "adamw"
    assert "skipped" in skipped.get("optimizer").reason
    with pytest.raises(proftune.ConfigError, match="optimizer_budget_s"):
        proftune.recommend(task, profile=_profile(0.5, 32), device="cpu", optimizer_budget_s=-1)


def test_a_range_test_already_run_is_reused_for_its_optimizer() -> None:
    task = IllConditionedRegression()
    known = run_lr_range_test(task, dict(task.default_params), steps=50, batch_size=32, device="cpu")
    assert known.suggested_lr is not None
    known = dataclasses.replace(known, suggested_lr=0.0123)
    cfg = CompareConfig(share_s=0.05, batch_size=32, lr_steps=50, noise_batches=4)
    comp = compare_optimizers(task, dict(task.default_params), profile=_profile(0.5, 32),
                              device=torch.device("cpu"), config=cfg, known_rates={"adamw": known})
    adamw = comp.trial("adamw")
    assert adamw is not None
    assert adamw.params["lr"] == 0.0123
    assert comp.trial("sgd") is not None
    assert comp.trial("sgd").params["lr"] != 0.0123  # its own range test


class _OwnOptimizer(IllConditionedRegression):
    def configure_optimizer(self, model: nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        return torch.optim.Adam(model.parameters(), lr=1e-3)


def test_a_task_that_fixes_its_optimizer_is_still_compared_and_told_so() -> None:
    task = _OwnOptimizer()
    cfg = CompareConfig(share_s=0.05, batch_size=32, lr_steps=50, noise_batches=4)
    comp = compare_optimizers(task, dict(task.default_params), profile=_profile(0.5, 32),
                              device=torch.device("cpu"), config=cfg)
    assert comp.honours_param is False
    assert {t.optimizer for t in comp.trials} >= {"adamw", "sgd"}
