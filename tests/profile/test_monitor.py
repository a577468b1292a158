"""The Monitor: sampling every N-th step, hooks only on sampled steps, callbacks, the profile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import proftune
from proftune.exceptions import ConfigError
from proftune.profile import Monitor, Profile
from proftune.train import Callback, FitState


def _hook_count(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    n = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return n + len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks)


class Recorder(Callback):
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.findings = ["a finding"]

    def on_fit_start(self, state: FitState) -> None:
        self.events.append(("fit_start", state.step))

    def on_step_start(self, state: FitState) -> None:
        self.events.append(("step_start", state.step))

    def on_after_backward(self, state: FitState) -> None:
        grads = [p.grad is not None for p in state.model.parameters()]
        self.events.append(("after_backward" if all(grads) else "no_grads", state.step))

    def on_step_end(self, state: FitState) -> None:
        self.events.append(("step_end", state.step))

    def on_fit_end(self, state: FitState) -> None:
        self.events.append(("fit_end", state.step))


def _setup() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt, torch.randn(32, 8), torch.randint(0, 3, (32,))


def test_hooks_only_on_sampled_steps_and_profile_built() -> None:
    model, opt, x, y = _setup()
    hooked = []
    with Monitor(model, opt, every=3) as mon:
        for _ in range(12):
            hooked.append(_hook_count(model, opt) > 0)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    assert hooked == [False, False, True] * 4  # the 3rd, 6th, 9th and 12th step only
    assert _hook_count(model, opt) == 0
    assert mon.samples == 4
    p = mon.profile
    assert isinstance(p, Profile)
    assert p.params.total == sum(q.numel() for q in model.parameters())
    assert p.macs == 32 * (8 * 32 + 32 * 3)
    assert p.batch_size == 32
    assert [lay.name for lay in p.layers] == ["0", "1", "2"]
    assert all(lay.forward_ms is not None and lay.forward_ms > 0 for lay in p.layers)
    assert p.layers[0].stats["activation"]["numel"] == 32 * 32
    assert p.memory.optimizer_bytes == 2 * p.memory.params_bytes
    assert p.grad.norm is not None
    assert p.grad.norm > 0
    assert p.grad.var is not None  # four samples
    assert p.step.time_ms > 0
    assert p.step.throughput > 0
    # samples take turns: time and activations, then statistics
    assert p.layers[0].stats["grad"]["samples"] == 2
    assert p.grad.update_ratio is not None
    assert p.grad.update_ratio > 0


def test_callbacks_get_the_fit_loop_hooks() -> None:
    model, opt, x, y = _setup()
    rec = Recorder()
    with Monitor(model, opt, every=100, callbacks=[rec]) as mon:
        for _ in range(2):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            mon.step(loss)
    assert rec.events == [
        ("fit_start", 0),
        ("step_start", 0), ("after_backward", 0), ("step_end", 1),
        ("step_start", 1), ("after_backward", 1), ("step_end", 2),
        ("fit_end", 2),
    ]
    assert mon.findings == ["a finding"]
    assert mon.state.loss is not None
    assert mon.state.task is None
    with pytest.raises(RuntimeError, match="no step was sampled"):
        _ = mon.profile


def test_every_is_validated() -> None:
    model, opt, _, _ = _setup()
    with pytest.raises(ConfigError, match="every"):
        Monitor(model, opt, every=0)


def test_top_level_exports() -> None:
    assert proftune.Monitor is Monitor
    assert proftune.Profile is Profile


def test_cpu_peak_on_request_and_time_only_monitor() -> None:
    model, opt, x, y = _setup()
    with Monitor(model, opt, every=2, stats=False, peak_memory=True) as mon:
        for _ in range(4):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    p = mon.profile
    mem = p.memory
    assert mem.peak_bytes >= mem.params_bytes + mem.optimizer_bytes + mem.activations_bytes
    assert mem.activations_bytes >= 32 * 32 * 4  # at least the hidden layer's output, fp32
    assert all(lay.stats == {} for lay in p.layers)  # no statistics asked for
    assert p.grad.norm is not None  # the global norm is cheap and always taken
    assert p.step.forward_ms > 0
    assert p.step.backward_ms > 0
    assert p.step.optimizer_ms > 0
