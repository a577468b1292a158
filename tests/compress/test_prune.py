"""Pruning: unstructured masks made permanent, structured cuts through Torch-Pruning, clear errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from proftune.compress import prune_structured, prune_unstructured, ratios_from_sensitivity
from proftune.compress._prune import make_permanent, sparsity
from proftune.compress._sensitivity import LayerSensitivity
from proftune.exceptions import ConfigError
from proftune.task import load_task


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


@pytest.mark.parametrize("global_pruning", [False, True])
def test_unstructured_reaches_the_ratio_and_is_permanent(global_pruning: bool) -> None:
    model = _mlp()
    prune_unstructured(model, 0.6, global_pruning=global_pruning)
    assert sparsity(model) == pytest.approx(0.6, abs=0.01)
    # permanent: plain weights, no masks or forward pre-hooks left
    assert all(not hasattr(m, "weight_orig") and not m._forward_pre_hooks for m in model.modules())
    if not global_pruning:
        for m in model.modules():
            if isinstance(m, nn.Linear):
                assert float((m.weight == 0).float().mean()) == pytest.approx(0.6, abs=0.02)


def test_unstructured_masks_survive_training_until_made_permanent() -> None:
    model = _mlp()
    prune_unstructured(model, 0.5, permanent=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(torch.randn(8, 16)).pow(2).mean().backward()
    opt.step()
    make_permanent(model)
    assert sparsity(model) == pytest.approx(0.5, abs=0.01)


def test_structured_cuts_channels_keeps_the_classifier_and_rounds() -> None:
    model = load_task("digits-cnn").build_model({}).eval()
    before = sum(p.numel() for p in model.parameters())
    x = torch.randn(2, 1, 8, 8)
    prune_structured(model, x, 0.5, ignored=[model[-1]], round_to=4)
    after = sum(p.numel() for p in model.parameters())
    assert after < 0.4 * before
    assert model(x).shape == (2, 10)
    assert model[-1].out_features == 10
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            assert m.out_channels % 4 == 0


class _Detaching(nn.Module):
    """A layer that leaves the autograd graph: Torch-Pruning cannot see past it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(x.detach().numpy().copy())


def test_untraceable_model_names_the_layer_and_suggests_ignore_layers() -> None:
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), _Detaching(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 64, 10))
    with pytest.raises(ConfigError) as err:
        prune_structured(model, torch.randn(2, 1, 8, 8), 0.5, ignored=[model[-1]])
    msg = str(err.value)
    assert "layer '2'" in msg
    assert "ignore_layers=('0',)" in msg  # the library names its argument
    # following the advice works: the layers before the break stay whole, the rest is cut
    prune_structured(model, torch.randn(2, 1, 8, 8), 0.5, ignored=[model[0], model[-1]])
    assert model[0].out_channels == 8
    assert model[3].out_channels == 4
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


class _HardCoded(nn.Module):
    """Reshapes with a hard-coded channel count: pruning breaks it at run time."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).mean(dim=(2, 3))
        return self.head(h.reshape(-1, 8))


def test_forward_failure_after_pruning_names_a_layer() -> None:
    model = _HardCoded()
    with pytest.raises(ConfigError, match=r"fails in layer 'head'.*ignore_layers=\('head',\)"):
        prune_structured(model, torch.randn(2, 1, 8, 8), 0.5, ignored=[model.head])


def test_bn_importance_without_batchnorm_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no BatchNorm"):
        prune_structured(_mlp(), torch.randn(2, 16), 0.5, importance="bn")


def test_sensitivity_ratios_spare_sensitive_layers_and_keep_the_mean() -> None:
    sens = [LayerSensitivity("a", 100, 0.5, 0.20), LayerSensitivity("b", 100, 0.5, 0.0),
            LayerSensitivity("c", 200, 0.5, 0.01)]
    ratios = ratios_from_sensitivity(sens, 0.4)
    assert ratios["a"] < ratios["c"] < ratios["b"]
    mean = (ratios["a"] * 100 + ratios["b"] * 100 + ratios["c"] * 200) / 400
    assert mean == pytest.approx(0.4, abs=1e-3)
    assert max(ratios.values()) <= 0.9


def test_selection_breaks_latency_ties_by_batch_latency_and_respects_the_budget() -> None:
    from proftune.compress._pipeline import Candidate, mark_pareto, select

    def cand(method: str, metric: float, lat1: float, latb: float, drop: float) -> Candidate:
        return Candidate(method=method, ratio=0.5, metric=metric, metric_drop=drop, params=1, macs=1,
                         size_bytes=1, latency_ms=lat1, latency_batch_ms=latb, batch_size=64)

    base = cand("baseline", 0.99, 1.00, 10.0, 0.0)
    a = cand("structured", 0.985, 0.50, 5.0, 0.005)
    b = cand("static", 0.984, 0.51, 1.0, 0.006)  # a tie at batch 1, far faster at batch 64
    c = cand("structured", 0.90, 0.20, 0.5, 0.09)  # fastest but over the budget
    cands = [base, a, b, c]
    assert select(cands, "latency_ms", 0.01) is b
    assert not c.within_budget
    assert b.within_budget
    mark_pareto(cands, "latency_ms", metric_up=True)
    assert [x.pareto for x in cands] == [True, True, False, True]
    assert select(cands, "latency_ms", 0.001) is None


def test_sensitivity_rows_and_their_chart_name_each_layer_by_what_it_is() -> None:
    """digits-cnn is an nn.Sequential: its layers' paths are 0, 3, 7, ...; the chart says what each is."""
    from types import SimpleNamespace

    from proftune.compress._sensitivity import layer_sensitivity
    from proftune.report import sensitivity_chart
    from proftune.report._html import Section

    task = load_task("digits-cnn")
    torch.manual_seed(0)
    model = task.build_model(dict(task.default_params)).eval()
    x = torch.randn(4, 1, 8, 8)
    sens = layer_sensitivity(model, x, ratio=0.5, baseline=1.0, score=lambda m: 1.0, ignored=[model[-1]])
    modules = {s.layer: s.module for s in sens}
    assert modules["0"] == "Conv2d 1→16 3x3"
    assert modules["13"] == "Linear 256→64"
    section = Section("s", "s")
    sensitivity_chart(section, SimpleNamespace(
        metric="accuracy", sensitivity=[{**vars(s)} for s in sens] + [{"layer": "old", "drop": 0.0}]))
    labels = section.blocks[0].figure["data"][0]["y"]
    assert "0 · Conv2d 1→16 3x3" in labels
    assert "old" in labels  # a record from before the rows named their module: the path alone
