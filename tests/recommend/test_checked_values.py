"""Each computed value checked against the task before it is used (issue 45): the lr ladder where
the range test sees a plateau, the critical batch only where the loss fell, the batch within the
data, the precision only where measured, and no search rung before the defaults' curve ranks."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

import proftune
from proftune.examples import TensorBatches
from proftune.optimize._budget_plan import rankable_epoch
from proftune.recommend._api import MIN_STEPS_PER_EPOCH, data_bound
from proftune.recommend._lr_ladder import LadderRung, read_ladder, run_lr_ladder
from proftune.recommend._noise_scale import NoiseScaleResult
from proftune.recommend._precision import checked_precision_row
from proftune.recommend._records import Recommendation


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:8].sum(1) > 0).long()
    return x, y


class PlateauMLP(proftune.ClassificationTask):
    """A tanh MLP with a tiny init: its loss sits at ln(4) at a small rate (a plateau start)."""

    name = "plateau-mlp"
    default_params: ClassVar[dict[str, Any]] = {"lr": 3e-5, "batch_size": 16, "optimizer": "adamw"}
    default_epochs: ClassVar[int] = 2

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
        for mod in m.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=0.01)
                nn.init.zeros_(mod.bias)
        return m

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Any:
        x, y = _data()
        return TensorBatches(x, y, batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Any:
        x, y = _data()
        return TensorBatches(x[:100], y[:100], batch_size, shuffle=False)


def test_the_ladder_finds_a_rate_far_above_a_plateau_default() -> None:
    task = PlateauMLP()
    result = run_lr_ladder(task, proftune.TrainParams.of(task), centre_lr=3e-5, rungs=5, steps=40, device="cpu")
    assert result.best_lr is not None, result.message
    assert result.best_lr >= 30 * 3e-5, result.describe()
    lowest = min(result.rungs, key=lambda r: r.lr)
    assert not lowest.fell()  # the default's neighbourhood sits on the plateau


def test_a_ladder_where_nothing_fell_decides_nothing() -> None:
    flat = [LadderRung(lr=lr, steps=40, start_loss=1.386, end_loss=1.386, noise=0.001, diverged=False)
            for lr in (1e-4, 3e-4, 1e-3)]
    reading = read_ladder([*flat, LadderRung(lr=1.0, steps=3, start_loss=1.4, end_loss=None, noise=None,
                                             diverged=True)])
    assert reading.best_lr is None
    assert "none of 4 rates" in reading.message


def test_a_batch_is_bounded_by_the_training_set_and_its_steps_per_epoch() -> None:
    task = PlateauMLP()
    bound = data_bound(task, proftune.TrainParams.of(task), 16)
    assert bound is not None
    assert bound.samples == 400
    assert bound.cap == 400 // MIN_STEPS_PER_EPOCH
    assert "400 training samples" in bound.describe()
    # a target the user gives is bounded by the training set only
    given = data_bound(task, proftune.TrainParams.of(task), 16, target_batch=300)
    assert given is not None
    assert given.cap == 300
    huge = data_bound(task, proftune.TrainParams.of(task), 16, target_batch=3200)
    assert huge is not None
    assert huge.cap == 400


def _noise(losses: list[float]) -> NoiseScaleResult:
    return NoiseScaleResult(b_simple=3200.0, trace_sigma=1.0, grad_sq_norm=1.0, small_batch=8, big_batch=32,
                            steps=len(losses), used_steps=len(losses), clipped_steps=0, ema=0.9, history=(),
                            losses=tuple(losses))


def test_a_noise_scale_on_a_plateau_is_not_learning() -> None:
    flat, reason = _noise([2.3026 + 0.0005 * ((-1) ** i) for i in range(30)]).learning()
    assert not flat
    assert "no fall" in reason
    falling, _ = _noise([2.3 - 0.03 * i for i in range(30)]).learning()
    assert falling


def test_recommend_uses_no_critical_batch_measured_where_the_loss_did_not_fall() -> None:
    task = PlateauMLP()
    # the range test and the ladder off: the noise scale is taken at the plateau's own rate
    recs = proftune.recommend(task, device="cpu", lr_steps=10, ladder_steps=0, noise_steps=12,
                              optimizer_budget_s=0, embedding_budget_s=0, precision_check=False)
    crit = recs.get("critical_batch_size")
    assert crit.value is None, crit.reason
    assert "not learning" in crit.reason
    assert recs.get("batch_size").value <= 400


def test_precision_is_fp32_unless_measured() -> None:
    row = Recommendation("precision", "bf16", "this CPU has avx512_bf16.", {}, "medium", "")
    kept = checked_precision_row(row, PlateauMLP(), proftune.TrainParams(), device=torch.device("cpu"), seed=0,
                                 measure=False)
    assert kept.value == "fp32"
    assert "no timed comparison" in kept.reason
    fp32 = Recommendation("precision", "fp32", "keep fp32.", {}, "medium", "")
    assert checked_precision_row(fp32, PlateauMLP(), proftune.TrainParams(), device=torch.device("cpu"), seed=0) is fp32


def test_no_rung_before_the_defaults_curve_separates() -> None:
    # a curve still at chance (0.1) for 3 epochs, then learning: the first rung that ranks is epoch 4+
    assert rankable_epoch(0.1, [0.1, 0.11, 0.1, 0.5, 0.8, 0.9], maximize=True, val_samples=300) == 4
    assert rankable_epoch(0.1, [0.1, 0.1, 0.104, 0.1], maximize=True, val_samples=300) is None
    assert rankable_epoch(2.3, [1.0, 0.5, 0.4], maximize=False, val_samples=300) == 1
    assert rankable_epoch(None, [0.5], maximize=True, val_samples=300) is None
