from __future__ import annotations

import pytest
import torch

from proftune.profile import LayerProfile, MemoryProfile, Profile, StepProfile
from proftune.recommend import (
    Recommendation,
    _rules,
    bottleneck_rule,
    data_loading_rule,
    precision_rule,
)


def _profile(*, device: str = "cpu", data_ms: float = 1.0, layers: tuple[LayerProfile, ...] = ()) -> Profile:
    return Profile(task="t", device=device, batch_size=64, mode="train", steps=3,
                   memory=MemoryProfile(params_bytes=1000, grads_bytes=1000, optimizer_bytes=2000,
                                        activations_bytes=8 * 2**20, peak_bytes=10 * 2**20),
                   step=StepProfile(time_ms=20.0, data_ms=data_ms, forward_ms=6.0, backward_ms=10.0,
                                    optimizer_ms=3.0, other_ms=0.0, throughput=3200.0),
                   layers=layers)


MATMUL_HEAVY = (
    LayerProfile("fc1", "Linear", params=8000, macs=500_000, forward_ms=4.0, backward_ms=8.0),
    LayerProfile("act", "ReLU", forward_ms=0.3, backward_ms=0.3),
    LayerProfile("fc2", "Linear", params=1000, macs=60_000, forward_ms=1.0, backward_ms=1.5),
)
NORM_HEAVY = (
    LayerProfile("conv", "Conv2d", params=9000, macs=900_000, forward_ms=2.0, backward_ms=3.0),
    # bn's share over five layer-timed steps: 48% at its fastest, its second-fastest at 50%, its
    # middle half 50-56%: well beyond noise
    LayerProfile("bn", "BatchNorm2d", params=64, forward_ms=3.0, backward_ms=3.0, time_share=0.48,
                 time_share_second=0.50, time_share_median=0.53, time_share_q1=0.50, time_share_q3=0.56,
                 time_share_samples=5),
    LayerProfile("pool", "MaxPool2d", forward_ms=0.3, backward_ms=0.2),
    LayerProfile("fc", "Linear", params=1000, macs=50_000, forward_ms=0.5, backward_ms=0.5),
)


def test_data_loading_flags_waits_above_ten_percent() -> None:
    slow = data_loading_rule(_profile(data_ms=5.0))
    assert isinstance(slow, Recommendation)
    assert slow.name == "data_loading"
    assert slow.value["num_workers"] >= 1
    assert slow.value["pin_memory"] is False
    assert slow.evidence["data_share"] == pytest.approx(0.25)
    assert "25%" in slow.reason
    fine = data_loading_rule(_profile(data_ms=1.0))
    assert fine.value == "no change"
    assert fine.evidence["data_share"] == pytest.approx(0.05)
    assert data_loading_rule(_profile(device="cuda", data_ms=5.0)).value["pin_memory"] is True


def test_precision_on_cpu_without_bf16_instructions_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_rules, "cpu_bf16_flags", lambda: ())
    rec = precision_rule(_profile(layers=MATMUL_HEAVY))
    assert rec.value == "fp32"
    assert "AVX512-BF16" in rec.reason
    assert rec.evidence["share_of_step"] == pytest.approx(14.5 / 20.0)


def test_precision_on_cpu_with_amx_and_matmul_dominating_picks_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_rules, "cpu_bf16_flags", lambda: ("amx_bf16",))
    rec = precision_rule(_profile(layers=MATMUL_HEAVY))
    assert rec.value == "bf16"
    assert "72%" in rec.reason
    # Amdahl: 20 ms with 72.5% at 2x -> 12.75 ms
    assert "~12.75 ms" in rec.effect
    low = precision_rule(_profile(layers=NORM_HEAVY))
    assert low.value == "fp32"
    assert "at most" in low.reason


def test_precision_reads_cuda_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=0: (7, 5))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    rec = precision_rule(_profile(device="cuda", layers=MATMUL_HEAVY))
    assert rec.value == "fp16"
    assert "grad scaler" in rec.reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda idx=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert precision_rule(_profile(device="cuda", layers=MATMUL_HEAVY)).value == "bf16"


def test_bottlenecks_are_layers_whose_time_far_exceeds_their_work() -> None:
    rec = bottleneck_rule(_profile(layers=NORM_HEAVY))
    names = [d["layer"] for d in rec.value]
    assert names == ["bn"]  # 6 of 12.5 ms for 0.6% of the params and no MACs
    assert "torch.compile" in rec.value[0]["action"]
    assert rec.value[0]["time_share"] == pytest.approx(6 / 12.5)
    assert bottleneck_rule(_profile(layers=MATMUL_HEAVY)).value == []
    assert bottleneck_rule(_profile()).value is None


def test_a_bottleneck_within_its_noise_gets_no_advice() -> None:
    """The issue: one ReLU was 63% of the step in one run and 20% in the next, and the
    "fuse with torch.compile" advice followed. A share timed on one step is within the load's noise:
    the rule names it and advises nothing."""
    import dataclasses

    bn = NORM_HEAVY[1]
    # one timed step: no second step to tell a share from the load's noise, so no advice
    single = dataclasses.replace(bn, time_share_q1=None, time_share_q3=None, time_share_second=None,
                                 time_share_samples=1)
    rec = bottleneck_rule(_profile(layers=(NORM_HEAVY[0], single, *NORM_HEAVY[2:])))
    assert rec.value == []
    assert "torch.compile" not in rec.reason
    assert "No advice for bn" in rec.reason
    assert "too few to tell" in rec.reason
    assert [d["layer"] for d in rec.evidence["within_noise"]] == ["bn"]
    # a lone fast step among stalled ones is the layer's cost (a busy machine cannot make a step
    # faster): its share at that step is advised on
    lone = dataclasses.replace(bn, time_share_second=0.80, time_share_q1=0.85, time_share_q3=0.93)
    assert [d["layer"] for d in bottleneck_rule(_profile(layers=(NORM_HEAVY[0], lone, *NORM_HEAVY[2:]))).value] == [
        "bn"]
    # the same layer beyond its noise is advised, with its spread in the reason
    rec = bottleneck_rule(_profile(layers=NORM_HEAVY))
    assert [d["layer"] for d in rec.value] == ["bn"]
    assert "48% of time at its fastest of 5 steps, their middle half 1.0-1.2x as long" in rec.reason
