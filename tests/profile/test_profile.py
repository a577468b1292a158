"""proftune.profile(): timing adds up, memory is right, errors are clear, the record is complete."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import proftune
from proftune.exceptions import ConfigError
from proftune.profile import PeakMemory, Profile, peak_step_memory
from proftune.track import Store


@pytest.fixture(scope="module")
def cnn_profile() -> Profile:
    return proftune.profile("digits-cnn", batch_size=256, steps=3, device="cpu")


def test_layer_times_add_up_to_the_step(cnn_profile: Profile) -> None:
    p = cnn_profile
    per_layer = sum((lay.forward_ms or 0.0) + (lay.backward_ms or 0.0) for lay in p.layers)
    # the typical forward+backward of the layer-timed steps (by the fit loop's clock): the layers'
    # medians and what no layer covers at its median share of a step; the layers cover nearly all of it
    measured = p.config["timed_fwd_bwd_ms"]
    assert measured > 0
    assert abs(per_layer - measured) / measured < 0.15, (per_layer, measured)
    # a layer's share is its fastest step's time (a stall only adds time) over the step the pieces
    # make at their fastest: at or under the middle half of its steps on that scale, and the
    # shares and the rest add up to that step
    shares = 0.0
    for lay in p.layers:
        if lay.forward_ms is not None:
            assert lay.time_share is not None
            assert lay.time_share_q1 is not None
            assert lay.time_share_q3 is not None
            assert lay.time_share <= lay.time_share_q1 <= lay.time_share_q3
            shares += lay.time_share
    assert 0.5 < shares <= 1.0 + 1e-9
    assert per_layer + p.step.outside_layers_ms == pytest.approx(measured)  # the rest, named
    convs = [lay for lay in p.layers if lay.type == "Conv2d"]
    assert all(lay.backward_ms is not None and lay.backward_ms > 0 for lay in convs)
    assert all(lay.gflops_per_s is not None and lay.gflops_per_s > 0 for lay in convs)


def test_memory_accounting(cnn_profile: Profile) -> None:
    p, mem = cnn_profile, cnn_profile.memory
    assert mem.params_bytes == 4 * p.params.total  # fp32
    assert mem.grads_bytes == mem.params_bytes
    assert mem.optimizer_bytes == 2 * mem.params_bytes  # AdamW: exp_avg and exp_avg_sq
    assert mem.peak_bytes >= mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes
    # the activations saved for backward are most of this model's step, and all of them are live
    # at the end of the forward pass
    assert mem.activations_bytes > 0
    assert mem.peak_bytes >= mem.params_bytes + mem.optimizer_bytes + mem.activations_bytes
    assert sum(lay.activation_bytes or 0 for lay in p.layers) <= mem.activations_bytes
    first_conv = p.layer("0")
    assert first_conv.activation_bytes == 256 * 1 * 8 * 8 * 4  # it saves its fp32 input


def test_record_is_complete(cnn_profile: Profile, tmp_path: Path) -> None:
    p = cnn_profile
    assert p.params.total == sum(lay.params for lay in p.layers)
    assert p.macs > 0
    assert p.flops == 2 * p.macs
    assert p.backward_flops > p.flops
    assert p.step.time_ms > 0
    assert p.step.throughput == pytest.approx(256 / (p.step.time_ms / 1e3))
    assert p.step.forward_ms > 0
    assert p.step.backward_ms > 0
    assert p.step.optimizer_ms > 0
    assert p.grad.norm is not None
    assert p.grad.var is not None
    assert p.grad.update_ratio is not None
    stats = p.layer("3").stats
    assert set(stats) >= {"weight", "activation", "grad"}
    assert set(stats["activation"]) >= {"mean", "std", "min", "max", "p1", "p50", "p99", "zero_frac", "nonfinite"}
    assert stats["grad"]["norm"] > 0
    assert stats["grad"]["update_ratio"] > 0
    assert p.layer("2").stats["activation"]["zero_frac"] > 0.2  # a ReLU
    top = p.bottlenecks[0]
    assert top["time_share"] == max(lay.time_share or 0.0 for lay in p.layers)
    assert {"name", "time_share", "params_share", "macs_share"} <= set(top)
    assert Profile.load(p.save(tmp_path / "p.json")) == Profile.from_dict(json.loads(p.to_json()))


def test_peak_memory_measures_a_known_allocation() -> None:
    tracker = PeakMemory(torch.device("cpu")).start(baseline=1000)
    a = torch.empty(8_000_000, dtype=torch.uint8)
    b = torch.empty(1_000_000, dtype=torch.float32)
    del a, b
    c = torch.empty(1_000, dtype=torch.uint8)
    peak = tracker.stop()
    del c
    assert 1000 + 12_000_000 <= peak <= 1000 + 12_000_000 + 64 * 1024


def test_peak_step_memory_grows_with_batch_size() -> None:
    small = peak_step_memory("digits-mlp", {"hidden": 256}, batch_size=16, device="cpu")
    large = peak_step_memory("digits-mlp", {"hidden": 256}, batch_size=512, device="cpu")
    assert large > small
    # each extra sample keeps at least its hidden activations (2 layers x 256 fp32)
    assert large - small >= (512 - 16) * 2 * 256 * 4
    assert proftune.profile.peak_step_memory is peak_step_memory


def test_inference_profile() -> None:
    p = proftune.profile("digits-mlp", batch_size=32, steps=2, inference=True, device="cpu")
    assert p.mode == "inference"
    assert p.step.backward_ms == 0
    assert p.step.optimizer_ms == 0
    assert p.step.forward_ms > 0
    assert p.memory.grads_bytes == 0
    assert p.memory.optimizer_bytes == 0
    assert p.memory.activations_bytes == 0
    assert p.memory.peak_bytes >= p.memory.params_bytes
    assert all(lay.backward_ms is None for lay in p.layers)
    assert p.backward_flops == 0


def test_module_with_example_input_is_left_untouched() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True), nn.Flatten(),
                          nn.Linear(8 * 6 * 6, 5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    p = proftune.profile(model, example_input=torch.randn(4, 3, 8, 8), batch_size=16, steps=2, device="cpu")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert p.batch_size == 16
    assert p.task == "Sequential"
    assert p.macs == 16 * (8 * 6 * 6 * 27 + 5 * 8 * 6 * 6)
    # BatchNorm followed by an in-place ReLU (torchvision's pattern) still gets a backward time
    assert p.layer("1").backward_ms is not None


def test_attention_is_one_layer_with_forward_and_backward_time() -> None:
    p = proftune.profile("digits-transformer", batch_size=32, steps=1, device="cpu")
    attn = p.layer("blocks.0.attn")
    assert attn.type == "MultiheadAttention"
    assert attn.forward_ms
    assert attn.backward_ms
    assert attn.macs == 32 * (4 * 8 * 32 * 32 + 2 * 8 * 8 * 32)
    # eval mode under no_grad takes MultiheadAttention's fused fast path: the same MACs
    inf = proftune.profile("digits-transformer", batch_size=32, steps=1, inference=True, device="cpu")
    assert inf.layer("blocks.0.attn").macs == attn.macs
    assert inf.macs == p.macs


def test_bad_input_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        proftune.profile("digits-mlp", batch_size=0)
    with pytest.raises(ConfigError) as err:
        proftune.profile("digits-mlp", steps=0, detail="everything")
    assert "steps" in str(err.value)
    assert "detail" in str(err.value)
    with pytest.raises(ConfigError, match="example_input"):
        proftune.profile(nn.Linear(2, 2))


class _Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_forward_error_names_the_layer_and_its_input_shapes() -> None:
    with pytest.raises(ConfigError) as err:
        proftune.profile(_Broken(), example_input=torch.randn(4, 64), device="cpu")
    msg = str(err.value)
    assert "'body.2'" in msg
    assert "Linear" in msg
    assert "(4, 32)" in msg


def test_trace_and_store(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    trace = tmp_path / "trace.json"
    p = proftune.profile("digits-mlp", batch_size=32, steps=1, warmup=0, detail="step", device="cpu",
                         trace=trace, store=store)
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("linear" in str(e.get("name", "")).lower() for e in events)
    run = store.get_run(p.config["run_id"])
    assert run.kind == "profile"
    assert run.status == "finished"
    assert run.metrics["step_time_ms"] == pytest.approx(p.step.time_ms)
    assert run.result["params"]["total"] == p.params.total
    assert p.layers
    assert all(lay.forward_ms is None for lay in p.layers)


@pytest.mark.slow
def test_resnet18_inplace_relu_times_add_up() -> None:
    pytest.importorskip("torchvision")
    p = proftune.profile("resnet18-synthetic", batch_size=8, steps=2, device="cpu")
    per_layer = sum((lay.forward_ms or 0.0) + (lay.backward_ms or 0.0) for lay in p.layers)
    measured = p.config["timed_fwd_bwd_ms"]
    assert abs(per_layer - measured) / measured < 0.15, (per_layer, measured)
    # BatchNorm followed by ReLU(inplace=True) everywhere: every conv and norm has a backward time
    assert all(lay.backward_ms for lay in p.layers if lay.type in ("Conv2d", "BatchNorm2d"))
    assert p.params.total == 11_689_512
    assert p.memory.optimizer_bytes == 2 * p.memory.params_bytes


def test_peak_step_memory_is_the_profile_peak() -> None:
    p = proftune.profile("digits-mlp", batch_size=128, steps=1, detail="step", device="cpu")
    direct = peak_step_memory("digits-mlp", {}, batch_size=128, device="cpu")
    # the same definition, a different step of a different run: equal up to allocator noise
    assert abs(direct - p.memory.peak_bytes) <= 0.1 * p.memory.peak_bytes, (direct, p.memory.peak_bytes)


def test_gradient_accumulation_times_and_throughput() -> None:
    # four timed steps: their medians outlast a busy machine's spikes (two read 0.84 once at load 5)
    p = proftune.profile("digits-cnn", params={"grad_accumulation": 2}, batch_size=128, steps=4, device="cpu")
    per_layer = sum((lay.forward_ms or 0.0) + (lay.backward_ms or 0.0) for lay in p.layers)
    measured = p.config["timed_fwd_bwd_ms"]
    assert abs(per_layer - measured) / measured < 0.15, (per_layer, measured)
    assert p.batch_size == 128
    assert p.step.throughput == pytest.approx(2 * 128 / (p.step.time_ms / 1e3))  # both micro-batches


def test_a_trace_that_was_not_written_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.profiler's export logs a C++ ERROR line and returns when it cannot write: the run
    must not be recorded finished with a trace that does not exist."""
    import torch.profiler

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", lambda self, path: None)
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    with pytest.raises(OSError, match="produced no file"):
        proftune.profile("digits-mlp", steps=1, detail="step", trace=tmp_path / "t.json", store=store)
    assert [r.status for r in store.list_runs()] == ["failed"]
    assert not (tmp_path / "t.json").exists()


def test_a_trace_path_is_checked_before_any_step(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'p.db'}")
    with pytest.raises(ConfigError, match="does not exist"):
        proftune.profile("digits-mlp", steps=1, trace=tmp_path / "missing" / "t.json", store=store)
    assert store.count_runs() == 0
    assert not (tmp_path / "missing").exists()


def test_profile_takes_a_config_or_its_fields_by_name() -> None:
    from proftune import ProfileConfig
    from proftune.exceptions import ConfigError

    cfg = ProfileConfig(batch_size=16, steps=1, device="cpu", detail="step")
    by_config = proftune.profile("digits-mlp", cfg)
    by_name = proftune.profile("digits-mlp", batch_size=16, steps=1, device="cpu", detail="step")
    assert by_config.memory.optimizer_bytes == by_name.memory.optimizer_bytes > 0
    assert by_config.config["steps"] == by_name.config["steps"] == 1
    assert by_config.batch_size == by_name.batch_size == 16
    assert proftune.profile("digits-mlp", cfg, batch_size=8).batch_size == 8  # a name overrides
    with pytest.raises(ConfigError, match=r"unknown options \['step'\]; valid: .*steps"):
        proftune.profile("digits-mlp", step=1)


def test_a_profile_steps_at_the_thread_count_the_fit_loop_chose_for_its_task() -> None:
    """On a busy machine torch's default count can be 100x slower than the one the fit loop
    measured best moments before; the profile's timed steps use that one."""
    from proftune import _threads
    from proftune.profile._api import _step_threads

    task = proftune.load_task("digits-mlp")
    cpu = torch.device("cpu")
    _threads.forget()
    assert _step_threads(task, cpu) == torch.get_num_threads()
    _threads.remember((task.name, "cpu"), 1, 64, 0)
    try:
        assert _step_threads(task, cpu) == 1
        assert _step_threads(task, torch.device("meta")) == torch.get_num_threads()  # CPU only
    finally:
        _threads.forget()
