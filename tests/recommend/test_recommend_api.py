from __future__ import annotations

import json

import pytest

import proftune
from proftune.profile import LayerProfile, MemoryProfile, Profile, StepProfile, peak_step_memory
from proftune.recommend import (
    RECOMMENDATION_NAMES,
    BatchSizeEvidence,
    NoiseScaleResult,
    Recommendation,
    Recommendations,
)
from proftune.recommend._full_batches import FullBatchTask
from proftune.track import Store


def test_function_and_subpackage_names_both_work() -> None:
    from proftune.recommend import find_batch_size, lr_find, noise_scale, recommend

    assert proftune.recommend.recommend is recommend  # proftune.recommend is the subpackage, called as recommend()
    assert callable(proftune.recommend)
    assert proftune.find_batch_size is find_batch_size
    assert proftune.lr_find is lr_find
    assert proftune.noise_scale is noise_scale
    assert proftune.Recommendation is Recommendation
    assert {"recommend", "find_batch_size", "lr_find", "noise_scale", "Recommendation"} <= set(proftune.__all__)


def test_recommendation_names_are_checked() -> None:
    with pytest.raises(ValueError, match="name='speed'"):
        Recommendation("speed", 1, "why")
    with pytest.raises(ValueError, match="confidence='sure'"):
        Recommendation("lr", 1e-3, "why", confidence="sure")


def test_recommend_derives_every_parameter_from_one_profile(db_url: str) -> None:
    task = proftune.load_task("digits-mlp")
    peak64 = peak_step_memory(FullBatchTask(task), None, batch_size=64, device="cpu")
    layers = (
        LayerProfile("0", "Linear", params=8320, macs=64 * 128 * 64, forward_ms=0.2, backward_ms=0.3),
        LayerProfile("1", "ReLU", forward_ms=0.05, backward_ms=0.05),
        LayerProfile("3", "Linear", params=16512, macs=128 * 128 * 64, forward_ms=0.3, backward_ms=0.5),
        LayerProfile("4", "ReLU", forward_ms=0.05, backward_ms=0.05),
        LayerProfile("6", "Linear", params=1290, macs=128 * 10 * 64, forward_ms=0.05, backward_ms=0.1),
    )
    profile = Profile(task="digits-mlp", device="cpu", batch_size=64, mode="train", steps=3,
                      memory=MemoryProfile(params_bytes=104_488, grads_bytes=104_488,
                                           optimizer_bytes=208_976, peak_bytes=peak64),
                      step=StepProfile(time_ms=2.5, data_ms=0.1, forward_ms=0.7, backward_ms=1.2,
                                       optimizer_ms=0.5, throughput=25_600.0),
                      layers=layers)
    budget = 2_000_000
    recs = proftune.recommend(task, profile=profile, memory_budget=budget, target_batch=1024, device="cpu",
                              lr_steps=25, noise_steps=6, store=db_url)
    assert isinstance(recs, Recommendations)
    assert [r.name for r in recs] == list(RECOMMENDATION_NAMES)
    by = {r.name: r for r in recs}
    batch = by["batch_size"]
    # the profile's own peak counts as a probe: two more probes and one verifying step, plus at
    # most one re-verification when the CPU allocator's noise (~3% between identical steps) puts
    # the first verified step just over the budget
    assert batch.evidence["runs"] <= 4, batch.evidence
    assert 0 < batch.value <= batch.evidence["max_batch_size"]
    assert batch.evidence["measured_peak_bytes"] <= budget
    accum = by["grad_accumulation"]
    assert accum.value * accum.evidence["micro_batch"] >= 1024
    assert accum.evidence["micro_batch"] <= batch.evidence["max_batch_size"]
    assert by["critical_batch_size"].value is not None
    assert by["critical_batch_size"].value > 0
    lr = by["lr"]
    # the range test on digits-mlp (AdamW) finds a rate; Adam-family rates sit in [1e-5, 1]
    assert isinstance(lr.value, float), (lr.value, lr.reason)
    assert 1e-5 <= lr.value <= 1.0, (lr.value, lr.reason)
    assert by["lr_scaling"].value == "sqrt"  # AdamW: square-root rule
    assert by["precision"].value in ("fp32", "bf16")
    assert by["data_loading"].value == "no change"
    assert all(r.confidence in ("high", "medium", "low") and r.reason for r in recs)
    json.dumps(recs.to_dict())  # JSON-able all the way down
    run = Store(db_url).get_run(recs.run_id)
    assert run.kind == "recommend"
    assert run.status == "finished"
    assert [r["name"] for r in run.result["recommendations"]] == list(RECOMMENDATION_NAMES)
    # the curves behind the values go with the run (the report draws them): the range test's
    # points from its first rate to where it stopped, and the noise scale per measured step
    curve = run.curves["lr_range"]
    assert len(curve) == lr.evidence["steps"]
    assert curve[0]["lr"] == pytest.approx(lr.evidence["start_lr"])
    assert len(run.curves["noise_scale"]) == by["critical_batch_size"].evidence["steps"]
    # what optimize and the report read of the evidence, as typed records from the package that wrote it
    read = Recommendations.from_dict(dict(run.result))
    bs_ev = BatchSizeEvidence.of(read.get("batch_size"))
    assert bs_ev.max_batch_size == batch.evidence["max_batch_size"]
    assert bs_ev.search is not None
    assert bs_ev.search.max_batch_size == bs_ev.max_batch_size
    assert bs_ev.memory_model
    ns_ev = NoiseScaleResult.of(read.get("critical_batch_size"))
    assert ns_ev is not None  # measured
    assert ns_ev.used_steps == by["critical_batch_size"].evidence["used_steps"] > 0
    assert ns_ev.b_simple is not None
    assert max(1, round(ns_ev.b_simple)) == by["critical_batch_size"].value
    with pytest.raises(ValueError, match="not 'batch_size'"):
        BatchSizeEvidence.of(read.get("lr"))
    assert BatchSizeEvidence.of(None) == BatchSizeEvidence()  # no row: nothing measured


def test_budget_below_the_model_itself_exits_with_the_batch_1_need() -> None:
    with pytest.raises(proftune.ConfigError, match=r"needs before any activation.*batch size 1 peaks at"):
        proftune.find_batch_size("digits-mlp", memory_budget=1000, device="cpu")


def test_the_noise_scale_is_measured_at_the_range_tests_rate_not_a_diverging_default() -> None:
    """digits-mlp at SGD lr 1.0 diverges: measured there, B_simple is ~3 and the batch size follows."""
    task = proftune.load_task("digits-mlp")
    recs = proftune.recommend(task, {"optimizer": "sgd", "momentum": 0.9, "lr": 1.0, "batch_size": 64},
                              device="cpu", lr_steps=50, noise_steps=15)
    by = {r.name: r for r in recs}
    suggested = by["lr"].evidence["suggested_lr"]
    assert suggested < 1.0
    assert by["critical_batch_size"].evidence["lr"] == pytest.approx(suggested)
    assert by["critical_batch_size"].value >= 16, by["critical_batch_size"].reason
    assert by["batch_size"].value >= 16, by["batch_size"].reason
