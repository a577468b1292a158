"""LayerStats: weight, activation and gradient statistics per layer against direct computation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from proftune.profile import LayerStats, tensor_stats
from proftune.profile._summaries import (
    _reduce_rows_numpy,
    _reduce_rows_torch,
    _row_moments,
    _sample_index,
)


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


class _Mixed(nn.Module):
    """Outputs below and above the sample size, conv and linear units, a layer holding two
    weight matrices (MultiheadAttention), one that is changed in place after it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.ReLU(inplace=True)
        self.small = nn.Linear(8, 4)
        self.big = nn.Linear(8 * 8 * 8, 64)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.act(self.conv(x))  # conv's output is changed in place by the ReLU
        s = self.small(c.mean(dim=(2, 3)))
        b = self.big(c.flatten(1))
        q = b.reshape(b.shape[0], 4, 16)
        a, _ = self.attn(q, q, q)
        return s.sum() + a.sum()


def _reference(t: torch.Tensor, sample_size: int) -> dict[str, float]:
    """The statistics one tensor at a time, the plain way: torch's own reductions and
    ``torch.quantile`` of the same sample."""
    f = t.detach().reshape(-1).float()
    sample = f if f.numel() <= sample_size else f[_sample_index(f.numel(), sample_size, f.device, None)]
    q = torch.quantile(sample, torch.tensor([0.01, 0.5, 0.99]))
    return {"mean": float(f.mean()), "std": float(f.std(correction=0)), "min": float(f.min()),
            "max": float(f.max()), "p1": float(q[0]), "p50": float(q[1]), "p99": float(q[2]),
            "zero_frac": float((sample == 0).float().mean()), "numel": f.numel()}


def _reference_dead(t: torch.Tensor) -> float:
    sub = t.detach()[:32]
    unit = 1 if sub.dim() >= 4 else sub.dim() - 1
    dims = tuple(d for d in range(sub.dim()) if d != unit)
    zero = 1.0 - torch.sign(sub).abs().sum(dim=dims) / (sub.numel() // sub.shape[unit])
    return float((zero > 0.9).float().mean())


def _close(got: dict[str, float], want: dict[str, float]) -> None:
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_fused_statistics_equal_the_per_tensor_way() -> None:
    torch.manual_seed(0)
    model = _Mixed()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(6, 3, 8, 8)
    outputs: dict[str, torch.Tensor] = {}
    names = {m: n for n, m in model.named_modules()}

    def keep(mod: nn.Module, args: object, out: object) -> None:
        outputs.setdefault(names[mod], (out[0] if isinstance(out, tuple) else out).clone())  # type: ignore[union-attr]

    handles = [m.register_forward_hook(keep) for m in (model.conv, model.small, model.big, model.attn)]
    ls = LayerStats(model, sample_size=64).attach(opt)
    model(x).backward()
    grads = {n: [p.grad.clone() for p in m.parameters()] for n, m in model.named_children()}
    before = {n: [p.detach().clone() for p in m.parameters()] for n, m in model.named_children()}
    opt.step()
    ls.detach()
    for h in handles:
        h.remove()
    stats = ls.collect(opt)
    assert list(stats) == ["conv", "act", "small", "big", "attn"]
    # activations: below (small: 24 values) and above the sample size, conv and linear units
    for name, out in outputs.items():
        _close(stats[name]["activation"], _reference(out, 64))
        assert stats[name]["activation"]["nonfinite"] == 0
    assert stats["conv"]["activation"]["dead_frac"] == _reference_dead(outputs["conv"])
    assert stats["small"]["activation"]["dead_frac"] == _reference_dead(outputs["small"])
    assert stats["conv"]["activation"]["min"] < 0  # read before the in-place ReLU changed it
    # weights, read after the step: one matrix, and attention's two matrices as one
    for name, mod in (("conv", model.conv), ("small", model.small), ("big", model.big)):
        want = _reference(mod.weight, 64)
        _close(stats[name]["weight"], {k: want[k] for k in ("mean", "std", "p1", "p50", "p99", "numel")})
        assert stats[name]["weight"]["l2"] == pytest.approx(float(mod.weight.detach().norm()), rel=1e-5)
    attn = torch.cat([model.attn.in_proj_weight.detach().reshape(-1), model.attn.out_proj.weight.detach().reshape(-1)])
    _close(stats["attn"]["weight"], {k: v for k, v in _reference(attn, 64).items() if k in ("mean", "std", "numel")})
    # gradients and update ratios: the layer's parameters together
    for name, gs in grads.items():
        if not gs:
            continue
        norm = math.sqrt(sum(float(g.norm()) ** 2 for g in gs))
        assert stats[name]["grad"]["norm"] == pytest.approx(norm, rel=1e-5)
        w = math.sqrt(sum(float(b.norm()) ** 2 for b in before[name]))
        assert stats[name]["grad"]["update_ratio"] == pytest.approx(0.1 * norm / w, rel=1e-4)
    assert ls.grad_norm() == pytest.approx(math.sqrt(sum(float(g.norm()) ** 2 for gs in grads.values() for g in gs)),
                                           rel=1e-5)


def test_a_tensor_with_nan_and_inf_is_counted_exactly_when_its_values_are_kept() -> None:
    x = torch.randn(5000)
    x[:7] = float("nan")
    x[7:10] = float("inf")
    s = tensor_stats(x, sample_size=256)
    finite = x[10:]
    assert s["nonfinite"] == 10
    assert s["mean"] == pytest.approx(float(finite.mean()), abs=1e-5)
    assert (s["min"], s["max"]) == (float(finite.min()), float(finite.max()))
    assert "estimated" not in s


def test_a_large_activation_with_nan_is_flagged_and_estimated_from_its_sample() -> None:
    class Poison(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.clone()
            y[0, :100] = float("nan")
            return y

    model = nn.Sequential(nn.Linear(16, 2000), Poison())
    ls = LayerStats(model, sample_size=64, gradients=False, weights=False)
    with ls:
        model(torch.randn(4, 16))
    act = ls.collect()["1"]["activation"]
    assert act["nonfinite"] >= 1
    assert act["estimated"] is True
    assert math.isfinite(act["mean"])
    assert "estimated" not in ls.collect()["0"]["activation"]


def test_the_device_path_reduces_rows_as_the_numpy_path_does() -> None:
    """On CPU the rows are reduced in numpy; elsewhere in torch ops on the device. Both are run
    here on CPU tensors, whole rows and samples with given moments; and the weights' moments."""
    torch.manual_seed(3)
    mat = torch.randn(5, 300)
    mat[1, :50] = 0.0
    mat[2, 7] = float("nan")
    moments = torch.randn(5, 4)
    for kw in ({}, {"moments": moments}):
        want = torch.from_numpy(_reduce_rows_numpy(mat, **kw))  # type: ignore[arg-type]
        got = _reduce_rows_torch(mat, **kw).double()  # type: ignore[arg-type]
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True), kw
    big = torch.randn(3, 5000)
    want = torch.stack([big.sum(1), (big * big).sum(1), big.amin(1), big.amax(1)], dim=1).double()
    assert torch.allclose(_row_moments(big).double(), want, rtol=1e-5)


def test_a_diverged_layer_s_statistics_raise_no_numpy_warning() -> None:
    """inf - inf in the quantiles of a diverged layer: NaN statistics, and no RuntimeWarning on stderr."""
    import warnings

    import numpy as np

    from proftune.profile._summaries import _reduce_rows_numpy

    mat = torch.tensor([[1.0, float("inf"), float("inf"), 2.0], [0.0, 1.0, 2.0, 3.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = _reduce_rows_numpy(mat)
    assert np.isfinite(out[1]).all()
    assert not np.isfinite(out[0]).all()
