"""The ``ddp_batch_size`` row: the per-rank batch at which the all-reduce is a small share of the step."""

from __future__ import annotations

import math

import pytest
import torch.distributed as dist

import proftune
from proftune.profile import DDPPoint, DDPScaling, StepProfile, profile_ddp_batches
from proftune.profile._ranks import RankRow, ddp_point, fit_scaling
from proftune.recommend._ddp import ddp_recommendation, plan_ddp_batch


def _point(b: int, step: float, ar: float = 30.0) -> DDPPoint:
    return DDPPoint(batch_size=b, step_ms=step, busy_ms=step - ar, allreduce_ms=ar, allreduce_bytes=4 << 20,
                    allreduce_calls=2, throughput=2 * b / step * 1e3, allreduce_share=ar / step)


def _scaling(fixed: float = 40.0, per_sample: float = 0.5, ar: float = 30.0) -> DDPScaling:
    points = [_point(b, fixed + per_sample * b, ar) for b in (32, 64, 128)]
    return fit_scaling(points, world_size=2, backend="gloo")


def test_the_line_through_the_points_and_the_batch_that_brings_the_all_reduce_to_its_share() -> None:
    s = _scaling()
    assert s.fixed_ms == pytest.approx(40.0)
    assert s.per_sample_ms == pytest.approx(0.5)
    assert s.allreduce_ms == pytest.approx(30.0)
    # 30 ms of all-reduce at most 10% of the step: step >= 300 ms, 40 + 0.5 B >= 300, B >= 520
    plan = plan_ddp_batch(s, current=32, share=0.10)
    assert plan.needed == pytest.approx(520.0)
    assert plan.batch_size == 520
    assert plan.limited_by is None
    assert plan.predicted_share == pytest.approx(0.10)
    assert plan.current_share == pytest.approx(30 / 56)
    assert plan.predicted_throughput == pytest.approx(2 * 520 / 300 * 1e3)
    # a looser target needs a smaller batch, rounded up to a multiple of 8
    assert plan_ddp_batch(s, current=32, share=0.25).batch_size == 8 * math.ceil(160 / 8)


def test_caps_memory_data_and_the_critical_batch_bound_the_batch() -> None:
    s = _scaling()
    assert plan_ddp_batch(s, current=32, max_batch=256).batch_size == 256
    assert plan_ddp_batch(s, current=32, max_batch=256).limited_by == "memory"
    crit = plan_ddp_batch(s, current=32, critical_batch=400, max_batch=1000)
    assert crit.batch_size == 200  # a global batch of 400 over 2 ranks
    assert crit.limited_by == "critical_batch"
    assert plan_ddp_batch(s, current=32, samples=100).batch_size == 100
    # a cap below the current batch keeps the current one
    assert plan_ddp_batch(s, current=32, critical_batch=40).batch_size == 32
    # already within the share: no change
    assert plan_ddp_batch(_scaling(ar=1.0), current=32).batch_size == 32


def test_a_step_that_did_not_grow_with_the_batch_is_noise_and_keeps_the_batch() -> None:
    noisy = fit_scaling([_point(32, 100.0), _point(64, 90.0), _point(128, 80.0)], world_size=2, backend="gloo")
    plan = plan_ddp_batch(noisy, current=32)
    assert plan.batch_size == 32
    assert plan.limited_by == "noise"
    row = ddp_recommendation(noisy, plan, lr=1e-3, optimizer="adamw", critical_batch=None)
    assert row.value == 32
    assert row.confidence == "low"
    assert "did not grow" in row.reason


def test_the_row_scales_the_lr_with_the_global_batch() -> None:
    s = _scaling()
    plan = plan_ddp_batch(s, current=32)
    row = ddp_recommendation(s, plan, lr=0.1, optimizer="sgd", critical_batch=None)
    assert row.name == "ddp_batch_size"
    assert row.value == 520
    assert row.evidence["lr"] == pytest.approx(0.1 * 520 / 32)  # linear for SGD, global 64 -> 1040
    assert row.evidence["allreduce_bytes"] == 4 << 20
    assert row.evidence["predicted_throughput"] > row.evidence["current_throughput"]
    assert len(row.evidence["points"]) == 3


def test_ranks_rows_become_a_point_from_the_slowest_step_and_the_median_all_reduce() -> None:
    rows = [RankRow(rank=r, batch_size=16, allreduce_ms=ar, allreduce_bytes=1000, allreduce_calls=1,
                    step=StepProfile(time_ms=step))
            for r, (step, ar) in enumerate([(10.0, 2.0), (12.0, 4.0), (11.0, 3.0)])]
    p = ddp_point(rows)
    assert p.step_ms == 12.0
    assert p.allreduce_ms == 3.0
    assert p.throughput == pytest.approx(3 * 16 / 12.0 * 1e3)


def test_recommend_checks_the_ddp_arguments() -> None:
    with pytest.raises(proftune.ConfigError, match="ddp must be"):
        proftune.recommend("digits-mlp", ddp=1, device="cpu")
    with pytest.raises(proftune.ConfigError, match="ddp_share"):
        proftune.recommend("digits-mlp", ddp=2, ddp_share=1.5, device="cpu")


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_gloo_ranks_measure_the_all_reduce_at_two_batch_sizes() -> None:
    task = proftune.load_task("digits-mlp")
    n_params = sum(p.numel() for p in task.build_model(dict(task.default_params)).parameters())
    s = profile_ddp_batches("digits-mlp", nprocs=2, batch_sizes=[32, 16], steps=2, warmup=1, rounds=1,
                            device="cpu")
    assert [p.batch_size for p in s.points] == [16, 32]
    assert s.world_size == 2
    assert s.backend == "gloo"
    assert s.allreduce_bytes == 4 * n_params  # every fp32 gradient, once per step
    assert all(p.allreduce_ms > 0 for p in s.points)
    assert s.step_ms(32) > 0


def test_a_plan_far_past_the_measured_batches_is_measured_there_and_planned_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The true step is 40 + 0.1·B up to 128 and steeper beyond (0.5 ms per sample): the line
    through 32..128 promises the 10% share at 2600; measured there, the plan comes back lower."""
    from proftune.recommend import _ddp

    def true_step(b: int) -> float:
        return 40 + 0.1 * b if b <= 128 else 40 + 12.8 + 0.5 * (b - 128)

    asked: list[list[int]] = []

    def fake(spec: object, *, batch_sizes: list[int], nprocs: int, **kw: object) -> DDPScaling:
        asked.append(sorted(batch_sizes))
        return fit_scaling([_point(b, true_step(b)) for b in sorted(batch_sizes)], world_size=nprocs, backend="gloo")

    monkeypatch.setattr(_ddp, "profile_ddp_batches", fake)
    scaling, plan = _ddp.measure_and_plan("t", nprocs=2, current=32, params={}, share=0.10)
    assert asked[0] == [32, 64, 128]
    assert len(asked) == 2
    assert asked[1][0] == 32
    first_plan = asked[1][1]
    assert 2600 <= first_plan <= 2608  # from the line through 32..128: 40 + 0.1 B >= 300
    assert [p.batch_size for p in scaling.points] == [32, 64, 128, first_plan]
    assert plan.batch_size < first_plan / 2  # the steeper measured slope needs a far smaller batch
