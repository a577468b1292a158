"""The Monitor: sampling every N-th step, hooks only on sampled steps, callbacks, the profile."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import proftune
from proftune.exceptions import ConfigError
from proftune.profile import Monitor, Profile
from proftune.profile._summaries import StepStats
from proftune.train import Callback, FitState

SRC = Path(proftune.__file__).resolve().parent


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


def test_monitor_and_profile_leave_stderr_clean() -> None:
    """torch.profiler's memory profiling (the CPU peak, a trace) logs a C++ allocator line per
    1,000 frees of tensors made before its window; none reaches stderr. torch is imported first,
    as in a user's script, so the log level proftune's import sets comes too late to help."""
    script = textwrap.dedent("""
        import torch, torch.nn.functional as F
        from torch import nn
        import proftune
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
        with proftune.Monitor(model, opt, every=2, peak_memory=True) as mon:
            for _ in range(6):
                loss = F.cross_entropy(model(x), y)
                loss.backward(); opt.step(); opt.zero_grad()
                mon.step(loss)
        assert mon.profile.memory.peak_bytes > 0
        p = proftune.profile(model, example_input=x, device="cpu", steps=2, warmup=1, trace=TRACE)
        assert p.memory.peak_bytes > 0
        import sys; print("user line", file=sys.stderr)
    """).replace("TRACE", repr(str(Path(tempfile.mkdtemp()) / "trace.json")))
    env = {k: v for k, v in os.environ.items() if k not in ("KINETO_LOG_LEVEL", "TORCH_CPP_LOG_LEVEL")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC.parent), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "user line\n"  # the allocator's line is gone; the user's own output is not


def _deep(layers: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(16, 16), nn.ReLU()]
    model = nn.Sequential(*mods)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(8, 16)


def _recorded_steps(mon: Monitor) -> list[StepStats]:
    """What each statistics sample of ``mon`` gathers (reduced when read, as the Monitor does)."""
    steps: list[StepStats] = []
    stats = mon._stats
    assert stats is not None
    gather = stats.gather

    def recording(optimizer: torch.optim.Optimizer | None = None) -> StepStats:
        steps.append(gather(optimizer))
        return steps[-1]

    stats.gather = recording  # type: ignore[method-assign]
    return steps


def test_statistics_rotate_over_a_deep_model_and_cover_every_layer_within_k_samples() -> None:
    model, opt, x = _deep(20)  # 40 layers: 10 per sample at stats_rotation=4
    names = [n for n, m in model.named_modules() if n]
    mon = Monitor(model, opt, every=1, timing=False, activations=False, stats_rotation=4)
    steps = _recorded_steps(mon)
    with mon:
        for _ in range(8):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
            if mon.samples == 4:
                after_k = mon.profile
    samples = [step.result() for step in steps]  # read after all of them ran: deferred
    assert len(samples) == 8
    per_sample = [{n for n, s in sample.items() if "activation" in s} for sample in samples]
    assert all(len(covered) == math.ceil(40 / 4) for covered in per_sample)
    assert set().union(*per_sample[:4]) == set(names)  # every layer within K=4 samples
    assert per_sample[4] == per_sample[0]  # then round again
    # the profile keeps each layer's latest statistics of each kind: complete after K samples
    for lay in after_k.layers:
        assert "activation" in lay.stats, lay.name
        assert ("weight" in lay.stats) == (lay.type == "Linear")
        assert ("grad" in lay.stats) == (lay.type == "Linear")
    # the global gradient norm is measured on every sample, over every layer
    assert len(mon._m.grad_norms) == 8
    assert mon.profile.grad.update_ratio is not None


def test_a_small_model_gets_every_layer_on_every_sample() -> None:
    model, opt, x = _deep(3)  # 6 layers <= STATS_MIN_LAYERS
    mon = Monitor(model, opt, every=1, timing=False, activations=False)
    steps = _recorded_steps(mon)
    with mon:
        for _ in range(2):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    assert len(steps) == 2
    assert all(all("activation" in s for s in step.result().values()) for step in steps)


def test_stats_rotation_is_validated() -> None:
    model, opt, _, _ = _setup()
    with pytest.raises(ConfigError, match="stats_rotation"):
        Monitor(model, opt, stats_rotation=0)


def _sampled_step_counts(layers: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    """(hooks on modules, global module hooks, host reads) during one sampled step of each kind."""
    model, opt, x = _deep(layers)
    reads = {"n": 0}

    def counting(name: str) -> None:
        orig = getattr(torch.Tensor, name)

        def wrapper(self: torch.Tensor, *a: object, **k: object) -> object:
            reads["n"] += 1
            return orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, wrapper)

    module_hooks = global_hooks = 0
    with Monitor(model, opt, every=1) as mon:
        for step in range(6):
            if step == 4:  # from here on: one time sample and one statistics sample, counted
                for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"):
                    counting(name)
            loss = model(x).square().mean()
            if step >= 4:
                module_hooks = max(module_hooks, sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                                                     for m in model.modules()))
                global_hooks = max(global_hooks, len(torch.nn.modules.module._global_forward_hooks)
                                   + len(torch.nn.modules.module._global_forward_pre_hooks))
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    monkeypatch.undo()
    return module_hooks, global_hooks, reads["n"]


def test_a_sampled_step_costs_the_same_hooks_and_host_reads_at_any_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    """What made sampled steps of deep models dear: a hook pair registered on every module and
    a host sync per tensor. Now two global hooks and a fixed number of host reads per step."""
    shallow = _sampled_step_counts(4, monkeypatch)
    deep = _sampled_step_counts(40, monkeypatch)
    assert shallow[:2] == deep[:2] == (2, 2)  # the model's own pre/post hook and the two global ones
    assert deep[2] == shallow[2]
    assert deep[2] <= 12


def test_a_statistics_sample_does_not_synchronise_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU only a timed sample's clocks wait for the device (per module and per phase); a
    statistics sample waits once, where it ends (the next step's clean time starts there).
    Counted here through the clock's callers."""
    from proftune.profile import _layers, _monitor

    model, opt, x = _deep(6)
    syncs = {"time": 0, "stats": 0}
    mon = Monitor(model, opt, every=1)
    mon._cuda = True  # as on a GPU: the device is what a synchronising clock is handed

    def counting(device: torch.device | None = None) -> float:
        if device is not None and mon._sampling is not None:
            syncs[mon._sampling] += 1
        return 0.0

    monkeypatch.setattr(_monitor, "clock", counting)
    monkeypatch.setattr(_layers, "clock", counting)
    with mon:
        for _ in range(4):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    assert syncs["stats"] == 2  # two statistics samples, one sync each
    assert syncs["time"] >= 2 * 12  # both timed samples: every module's start and end, and the phases


def test_max_overhead_spaces_samples_by_their_measured_cost() -> None:
    """A step of a tiny model costs far less than a sample of it: with ``max_overhead`` the
    samples come further apart than ``every`` (the gaps in the profile's config), and the
    profile is still made; a step that sleeps 20 ms makes the sample's cost small beside it,
    and the samples keep to ``every``."""
    import time as _time

    def train(model: nn.Module, opt: torch.optim.Optimizer, mon: Monitor, steps: int, sleep: float) -> None:
        x, y = torch.randn(8, 4), torch.randn(8, 1)
        for _ in range(steps):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sleep:
                _time.sleep(sleep)
            mon.step(loss)

    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Monitor(model, opt, every=5, max_overhead=0.015) as mon:
        train(model, opt, mon, 400, 0.0)
    prof = mon.profile
    assert min(mon.gaps) > 5
    assert max(mon.gaps) <= 50
    assert prof.config["max_overhead"] == 0.015
    assert prof.config["gaps"] == sorted(set(mon.gaps))
    assert 2 <= mon.samples < 400 // 5
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Monitor(model, opt, every=5, max_overhead=0.5) as slow:
        train(model, opt, slow, 30, 0.02)
    assert set(slow.gaps) == {5}
    with pytest.raises(ConfigError, match="max_overhead"):
        Monitor(model, opt, max_overhead=1.5)
