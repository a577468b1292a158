from __future__ import annotations

import pytest
import torch
from torch import nn

from proftune import AdaptiveLR, EarlyStopping, GradGuard, fit
from proftune.exceptions import ConfigError
from proftune.train import FitState

SGD = {"optimizer": "sgd", "momentum": 0.9, "batch_size": 64}


def test_adaptive_lr_rescues_a_rate_ten_times_too_large() -> None:
    fixed = fit("digits-mlp", {**SGD, "lr": 1.0}, epochs=3, seed=0)
    ctrl = AdaptiveLR()
    adaptive = fit("digits-mlp", {**SGD, "lr": 1.0}, epochs=3, seed=0, callbacks=[ctrl])
    assert fixed.metrics["accuracy"] < 0.3
    assert adaptive.metrics["accuracy"] > 0.85
    first = ctrl.changes[0]
    assert first["old_lr"] == 1.0
    assert first["new_lr"] == 0.5
    assert first["step"] < 15
    assert "threshold" in first["reason"]
    lrs = [r["lr"] for r in adaptive.curves["step"]]
    assert lrs[0] == 1.0
    assert lrs[-1] < 0.5


def _state(model: nn.Module, lr: float = 0.1) -> FitState:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return FitState(task=None, model=model, optimizer=opt, params={}, device=torch.device("cpu"))


def _set_grad(model: nn.Module, value: float) -> None:
    for p in model.parameters():
        p.grad = torch.full_like(p, value)


def test_adaptive_lr_raises_back_when_stable_but_not_past_the_unstable_rate() -> None:
    model = nn.Linear(4, 1)
    state = _state(model, lr=0.1)
    ctrl = AdaptiveLR(patience=5, cooldown=1, warmup=2)
    ctrl.on_fit_start(state)
    for step, g in enumerate([1, 1, 1, 1, 50, 1, 1] + [1] * 80):
        state.step = step
        _set_grad(model, g)
        ctrl.on_after_backward(state)
    reasons = [c["reason"] for c in ctrl.changes]
    assert ctrl.changes[0]["new_lr"] == pytest.approx(0.05)
    assert any(r.startswith("stable") for r in reasons)
    assert state.lr is not None
    assert state.lr <= 0.07 + 1e-12


def test_adaptive_lr_skips_non_finite_steps() -> None:
    model = nn.Linear(4, 1)
    state = _state(model)
    ctrl = AdaptiveLR()
    ctrl.on_fit_start(state)
    _set_grad(model, float("nan"))
    ctrl.on_after_backward(state)
    assert all(p.grad is None for p in model.parameters())
    assert state.lr == pytest.approx(0.05)
    assert "skipped" in ctrl.changes[0]["reason"]


def test_grad_guard_clips_a_spike_to_the_running_median() -> None:
    model = nn.Linear(4, 1)
    state = _state(model)
    guard = GradGuard(spike_factor=5, warmup=3)
    guard.on_fit_start(state)
    for step in range(5):
        state.step = step
        _set_grad(model, 0.1)
        guard.on_after_backward(state)
    normal = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))
    _set_grad(model, 100.0)
    guard.on_after_backward(state)
    clipped = float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert clipped == pytest.approx(normal, rel=1e-3)
    assert guard.events[-1]["action"] == "clip"
    assert guard.events[-1]["ratio"] > 500
    assert state.anomalies[-1]["kind"] == "grad_spike"


def test_grad_guard_in_the_fit_loop_clips_the_spikes_of_a_too_large_rate() -> None:
    guard = GradGuard()
    result = fit("digits-mlp", {**SGD, "lr": 1.0}, max_steps=30, seed=0, callbacks=[guard])
    clips = [e for e in guard.events if e["action"] == "clip"]
    assert clips
    assert all(e["ratio"] > 5 for e in clips)
    assert {a["kind"] for a in result.anomalies} >= {"grad_spike"}


def test_early_stopping_stops_and_restores_the_best_weights() -> None:
    from proftune.train import evaluate_model

    from .broken_tasks import HealthySGD

    stop = EarlyStopping("val_loss", patience=1, min_delta=10.0)  # nothing improves by 10
    result = fit(HealthySGD(), epochs=10, seed=0, callbacks=[stop])
    assert result.epochs == 3
    assert stop.best_at == 1
    assert stop.restored
    assert "early stopping" in (result.stop_reason or "")
    restored = evaluate_model(HealthySGD(), result.model, torch.device("cpu"), 64)
    assert restored["val_loss"] == pytest.approx(stop.best)


def test_early_stopping_mode_auto_and_validation() -> None:
    assert EarlyStopping("accuracy").mode == "max"
    assert EarlyStopping("val_loss").mode == "min"
    # from the registry, not the name: an error rate and mse are minimised, r2 maximised
    assert EarlyStopping("error").mode == "min"
    assert EarlyStopping("mse").mode == "min"
    assert EarlyStopping("r2").mode == "max"
    assert EarlyStopping("perplexity").mode == "min"
    # a name nothing knows: the task must declare its direction, else the fit stops at once
    with pytest.raises(ConfigError, match="metric_directions"):
        fit("digits-mlp", epochs=1, callbacks=[EarlyStopping("wobble")])
    with pytest.raises(ConfigError) as info:
        EarlyStopping(mode="up", patience=-1)
    assert "mode='up'" in str(info.value)
    assert "patience" in str(info.value)
    with pytest.raises(ConfigError, match="not a metric"):
        fit("digits-mlp", epochs=1, callbacks=[EarlyStopping("f1")])
