from __future__ import annotations

import math
import re

import pytest
import torch

from proftune import ConfigError, find_batch_size
from proftune.predict import MemoryModel, fit_memory_model
from proftune.profile import MemoryProfile, Profile
from proftune.recommend import search_max_batch
from proftune.recommend._batch_size import DataLimit

MiB = 2**20


class Linear:
    """A step whose peak is a + b·B (+ jitter), that runs out of memory above ``oom_at``."""

    def __init__(self, a: float, b: float, *, oom_at: int | None = None, jitter: float = 0.0,
                 curve: float = 0.0, data: int | None = None) -> None:
        self.a, self.b, self.oom_at, self.jitter, self.curve, self.data = a, b, oom_at, jitter, curve, data
        self.calls: list[int] = []

    def __call__(self, batch: int) -> int:
        if self.data is not None and batch > self.data:
            raise DataLimit(batch, self.data)
        self.calls.append(batch)
        if self.oom_at is not None and batch >= self.oom_at:
            raise torch.OutOfMemoryError(f"CUDA out of memory at batch {batch}")
        wiggle = self.jitter * math.sin(batch)
        return int(self.a + self.b * batch + self.curve * batch**2 + wiggle)

    def true_max(self, budget: int) -> int:
        b = 1
        while b + 1 < (self.oom_at or 10**9) and self(b + 1) <= budget:
            b += 1
        return b


@pytest.mark.parametrize(("a", "b", "budget"), [
    (50 * MiB, 0.3 * MiB, 400 * MiB),   # ~1160
    (2 * MiB, 40_000, 12 * MiB),         # ~260
    (500 * MiB, 3 * MiB, 8 * 1024 * MiB),  # ~2560
])
def test_linear_memory_lands_within_10_percent_in_at_most_4_runs(a: float, b: float, budget: int) -> None:
    measure = Linear(a, b, jitter=0.002 * b)
    result = search_max_batch(measure, budget, static_bytes=int(a / 2))
    truth = Linear(a, b, jitter=0.002 * b).true_max(budget)
    assert result.runs == len(measure.calls) <= 4
    assert 0.9 * truth <= result.max_batch_size <= truth
    assert result.measured_peak_bytes is not None
    assert result.measured_peak_bytes <= budget
    assert result.probes[-1].role == "verify"
    assert result.probes[-1].status == "fits"
    assert result.model.per_sample_bytes == pytest.approx(b, rel=0.01)
    assert result.predicted_peak_bytes == pytest.approx(result.measured_peak_bytes, rel=0.01)


def test_the_profile_point_is_used_not_remeasured() -> None:
    measure = Linear(10 * MiB, 0.1 * MiB)
    known = [(64, measure(64))]
    measure.calls.clear()
    result = search_max_batch(measure, 100 * MiB, known=known)
    assert 64 not in measure.calls
    assert result.runs == len(measure.calls) <= 3
    assert result.probes[0].role == "profile"


def test_out_of_memory_is_an_upper_bound_not_a_crash() -> None:
    # the device runs out at 300 although the budget would allow ~900
    measure = Linear(10 * MiB, 0.1 * MiB, oom_at=300)
    result = search_max_batch(measure, 100 * MiB)
    assert result.max_batch_size < 300
    assert any(p.status == "oom" for p in result.probes)
    assert result.probes[-1].status == "fits"


def test_a_convex_peak_is_caught_by_the_verifying_step() -> None:
    # activations that grow faster than linearly: the line through small probes under-predicts
    measure = Linear(5 * MiB, 0.05 * MiB, curve=200.0)
    budget = 80 * MiB
    result = search_max_batch(measure, budget)
    truth = Linear(5 * MiB, 0.05 * MiB, curve=200.0).true_max(budget)
    assert result.max_batch_size <= truth
    assert result.measured_peak_bytes <= budget
    assert result.max_batch_size >= 0.8 * truth


def test_the_data_limits_the_batch() -> None:
    measure = Linear(1 * MiB, 1000, data=1437)
    result = search_max_batch(measure, 4096 * MiB)
    assert result.max_batch_size == 1437
    assert result.limited_by == "data"


def test_fit_memory_model_margin_comes_from_the_residual() -> None:
    model = fit_memory_model([(10, 1000), (20, 2100), (30, 2900)], budget=10_000)
    assert isinstance(model, MemoryModel)
    assert model.residual_bytes == pytest.approx(100.0)  # fit 100 + 95·B: residuals -50, 100, -50
    assert model.margin_bytes == pytest.approx(2 * model.residual_bytes)
    assert model.largest_batch(10_000) == math.floor((10_000 - model.margin_bytes - model.intercept_bytes)
                                                     / model.per_sample_bytes)


def test_budget_below_the_static_memory_is_a_config_error_with_the_batch_1_need() -> None:
    measure = Linear(700_000, 40_000)
    with pytest.raises(ConfigError) as info:
        find_batch_size("digits-cnn", memory_budget="100KB", device="cpu", measure=measure)
    msg = str(info.value)
    assert "memory_budget=97.7 KiB" in msg
    assert "before any activation" in msg
    assert re.search(r"batch size 1 peaks at .* \(740000 bytes\)", msg)


def test_find_batch_size_reads_the_profile_and_records_a_run(db_url: str) -> None:
    from proftune.track import Store

    measure = Linear(700_000, 45_000)
    profile = Profile(task="digits-cnn", device="cpu", batch_size=64, mode="train",
                      memory=MemoryProfile(params_bytes=160_000, grads_bytes=160_000,
                                           optimizer_bytes=320_000, peak_bytes=measure(64)))
    measure.calls.clear()
    result = find_batch_size("digits-cnn", memory_budget="12MB", device="cpu", profile=profile,
                             measure=measure, store=db_url)
    assert result.runs == len(measure.calls) <= 3
    assert result.static_bytes == 640_000
    truth = Linear(700_000, 45_000).true_max(12_000_000)
    assert 0.9 * truth <= result.max_batch_size <= truth
    run = Store(db_url).get_run(result.run_id)
    assert run.kind == "batch_size"
    assert run.status == "finished"
    assert run.result["max_batch_size"] == result.max_batch_size


def test_a_small_dataset_caps_the_real_search_without_cycling_the_data() -> None:
    """A budget far above what 150 samples need: the real measure says DataLimit, not a huge batch."""
    from sklearn.datasets import load_iris

    from proftune import ClassificationTask
    from proftune.examples import TensorBatches

    x, y = load_iris(return_X_y=True)

    class Iris(ClassificationTask):
        name = "iris"
        default_params = {"lr": 1e-2, "batch_size": 16}  # noqa: RUF012

        def build_model(self, params: dict[str, object]) -> torch.nn.Module:
            return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))

        def train_data(self, batch_size: int, params: dict[str, object]) -> TensorBatches:
            return TensorBatches(torch.tensor(x, dtype=torch.float32), torch.tensor(y), batch_size, shuffle=True)

        def val_data(self, batch_size: int) -> TensorBatches:
            return TensorBatches(torch.tensor(x, dtype=torch.float32), torch.tensor(y), batch_size)

    result = find_batch_size(Iris(), memory_budget="512MiB", device="cpu")
    assert result.max_batch_size == len(y)
    assert result.limited_by == "data"
    # no probe measured a batch larger than the data (which would mean cycling it 60 times over);
    # counted, not timed: the cost is the probes' batches, whatever the machine's speed
    assert all(p.batch_size <= len(y) for p in result.probes)


def test_a_flat_start_of_the_peak_curve_is_not_extrapolated() -> None:
    """peak = max(optimizer step, activations): flat at small batches, then linear. The line must
    come from the growing part (a 3x1024 MLP on digits measured 41.2 MiB flat up to ~800, then
    ~20 KB/sample: one line through all probes answered 109 against a truth of 843)."""
    flat_peak, a, b = 41.2 * MiB, 26.0 * MiB, 20_000.0
    calls: list[int] = []

    def measure(batch: int) -> int:
        calls.append(batch)
        return int(max(flat_peak, a + b * batch))

    budget = int(42.9 * MiB)
    truth = int((budget - a) // b)
    result = search_max_batch(measure, budget, static_bytes=int(20 * MiB))
    assert 0.9 * truth <= result.max_batch_size <= truth, (result.max_batch_size, truth, calls)
    assert result.runs <= 6
    assert result.measured_peak_bytes is not None
    assert result.measured_peak_bytes <= budget


def test_a_line_with_a_large_intercept_is_not_mistaken_for_a_flat_start() -> None:
    measure = Linear(400 * MiB, 4_000)  # 16 and 32 differ by 0.015%: still one line
    budget = 440 * MiB
    result = search_max_batch(measure, budget, static_bytes=int(300 * MiB))
    truth = measure.true_max(budget)
    assert 0.9 * truth <= result.max_batch_size <= truth
    assert result.runs <= 4
