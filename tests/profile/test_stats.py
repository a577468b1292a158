"""LayerStats: weight, activation and gradient statistics per layer against direct computation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from proftune.profile import LayerStats, tensor_stats


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def test_tensor_stats_exact_moments_and_sampled_percentiles() -> None:
    torch.manual_seed(1)
    x = torch.randn(200_000)
    x[:50_000] = 0.0
    s = tensor_stats(x, sample_size=4096)
    assert s["mean"] == pytest.approx(float(x.mean()), abs=1e-5)
    assert s["std"] == pytest.approx(float(x.std(correction=0)), rel=1e-4)
    assert (s["min"], s["max"]) == (float(x.min()), float(x.max()))
    full = torch.sort(x).values
    assert s["p1"] == pytest.approx(float(full[int(0.01 * len(full))]), abs=0.1)
    assert s["p99"] == pytest.approx(float(full[int(0.99 * len(full))]), abs=0.1)
    assert abs(s["zero_frac"] - 0.25) < 0.03  # sampled: within about two standard errors
    assert s["nonfinite"] == 0


def test_nonfinite_values_are_counted_and_left_out_of_moments() -> None:
    x = torch.tensor([1.0, 2.0, float("nan"), float("inf"), 3.0])
    s = tensor_stats(x)
    assert s["nonfinite"] == 2
    assert s["mean"] == pytest.approx(2.0)
    assert s["max"] == 3.0


def test_layer_stats_match_direct_computation_and_keep_forward_order() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 16)
    ls = LayerStats(model).attach(opt)
    out = model(x)
    out.pow(2).mean().backward()
    grad0 = model[0].weight.grad.clone()
    bias_grad0 = model[0].bias.grad.clone()
    w_before = [p.detach().clone() for p in model[0].parameters()]
    opt.step()
    ls.detach()
    stats = ls.collect()
    assert list(stats) == ["0", "1", "2"]  # the order layers ran in
    first = stats["0"]
    assert first["weight"]["l2"] == pytest.approx(float(model[0].weight.detach().norm()), rel=1e-5)  # read now
    assert first["activation"]["numel"] == 64 * 32
    relu = stats["1"]["activation"]
    assert 0.2 < relu["zero_frac"] < 0.8  # about half the ReLU units are off
    assert relu["min"] == 0.0
    expected = math.sqrt(float(grad0.norm()) ** 2 + float(bias_grad0.norm()) ** 2)
    assert first["grad"]["norm"] == pytest.approx(expected, rel=1e-5)
    # SGD without momentum: the update is lr * grad exactly
    w_norm = math.sqrt(sum(float(w.norm()) ** 2 for w in w_before))
    assert first["grad"]["update_ratio"] == pytest.approx(0.1 * expected / w_norm, rel=1e-4)
    assert "grad" not in stats["1"]  # a ReLU has no parameters
    assert not ls.attached
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_update_ratio_estimated_from_adam_state_without_a_watched_step() -> None:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 16)).sum().backward()
    opt.step()
    ls = LayerStats(model, activations=False)
    stats = ls.collect(opt)
    # Adam's first step moves every weight by about lr: ratio ~ lr * sqrt(n) / ||w||
    w = model[0].weight.detach()
    approx = 1e-3 * math.sqrt(w.numel() + model[0].bias.numel()) / math.sqrt(
        float(w.norm()) ** 2 + float(model[0].bias.detach().norm()) ** 2)
    assert stats["0"]["grad"]["update_ratio"] == pytest.approx(approx, rel=0.05)


def test_sampling_does_not_touch_the_global_rng() -> None:
    model = _model()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    with LayerStats(model, sample_size=16) as ls:
        model(torch.ones(128, 16)).sum().backward()
    ls.collect()
    assert torch.equal(torch.rand(3), expected)
