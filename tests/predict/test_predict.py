"""predict: a training step traced with fake tensors against the profiler's measured CPU peak."""

from __future__ import annotations

import json
import resource
from typing import Any

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import proftune
from proftune.cli import app
from proftune.predict import MemoryModel, predict, resolve_target
from proftune.profile import Profile, count_model, peak_step_memory
from proftune.recommend._batch_size import verify_prediction
from proftune.recommend._full_batches import FullBatchTask

from .hf_tasks import Llama7B, TinyBert, TinyLlama

runner = CliRunner()


def _measured(task: Any, batch_size: int) -> int:
    return _measured_with(task, None, batch_size)


def _measured_with(task: Any, params: dict[str, Any] | None, batch_size: int) -> int:
    return int(peak_step_memory(FullBatchTask(proftune.load_task(task)), params, batch_size=batch_size,
                                device="cpu"))


@pytest.mark.parametrize(("task", "batch_size"), [
    ("digits-cnn", 32), ("digits-transformer", 64), (TinyBert(), 8), (TinyLlama(), 4),
])
def test_predicted_peak_matches_the_measured_cpu_peak(task: Any, batch_size: int) -> None:
    r = predict(task, batch_size=batch_size, target=None, max_batch=False)
    measured = _measured(task, batch_size)
    assert abs(r.memory.peak_bytes / measured - 1) < 0.05, (r.memory.peak_bytes, measured)
    assert r.real_steps == 0
    assert r.traces == 1
    assert r.peak.phase in ("forward", "backward", "optimizer")
    # the breakdown at the peak adds up to the peak, and the static parts are the model's
    assert sum(r.peak.breakdown.values()) == r.memory.peak_bytes
    assert r.memory.grads_bytes == r.memory.params_bytes  # fp32, every parameter trainable
    assert r.memory.activations_bytes > 0
    assert any(lay.activation_bytes > 0 for lay in r.layers)
    assert r.uncounted_ops == ()


def test_a_train_params_record_is_predicted_as_made_not_validated_again(monkeypatch: pytest.MonkeyPatch) -> None:
    import proftune._train_params as tp

    given = tp.TrainParams.of(proftune.task.load_task("digits-mlp"), {"optimizer": "sgd"})
    calls: list[dict[str, Any]] = []
    check = tp.validate_params
    monkeypatch.setattr(tp, "validate_params", lambda p: calls.append(p) or check(p))
    r = predict("digits-mlp", given, batch_size=16, target=None, max_batch=False)
    assert calls == []  # the record is taken as it was made
    # the same figures as the dict it was made from, which is merged over the defaults and checked once
    d = predict("digits-mlp", {"optimizer": "sgd"}, batch_size=16, target=None, max_batch=False)
    assert [c["optimizer"] for c in calls] == ["sgd"]
    assert (r.memory.peak_bytes, r.memory.optimizer_bytes) == (d.memory.peak_bytes, d.memory.optimizer_bytes)
    # an override given by name is one more check, over the record's params
    adamw = predict("digits-mlp", given, batch_size=16, target=None, max_batch=False, optimizer="adamw")
    assert [c["optimizer"] for c in calls] == ["sgd", "adamw"]
    assert adamw.memory.optimizer_bytes > r.memory.optimizer_bytes  # two moments per weight, against none


@pytest.mark.slow
def test_resnet18_peak_and_nothing_uncounted() -> None:
    r = predict("resnet18-synthetic", batch_size=4, target="a100", max_batch=False)
    measured = _measured("resnet18-synthetic", 4)
    assert abs(r.memory.peak_bytes / measured - 1) < 0.05, (r.memory.peak_bytes, measured)
    assert r.uncounted_ops == ()
    assert r.step.time_ms is not None
    assert r.step.time_ms > 0


def test_resnet18_count_has_no_uncounted_ops() -> None:
    torchvision = pytest.importorskip("torchvision")
    counts = count_model(torchvision.models.resnet18(), torch.randn(2, 3, 32, 32), backward=True)
    assert counts.macs > 0
    assert counts.uncounted_ops == []


# -- a custom op without a FLOP formula --------------------------------------------------------------


@torch.library.custom_op("proftune_test::mix", mutates_args=())
def mix(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


@mix.register_fake
def _mix_fake(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[1]))


def _mix_setup(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _mix_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, w = ctx.saved_tensors
    return grad @ w.t(), x.t() @ grad


mix.register_autograd(_mix_backward, setup_context=_mix_setup)


class MixNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8) * 0.1)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(mix(x, self.w))


class MixTask(proftune.ClassificationTask):
    name = "mix"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return MixNet()

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Any:
        gen = torch.Generator().manual_seed(0)
        return [(torch.randn(batch_size, 16, generator=gen), torch.randint(0, 3, (batch_size,), generator=gen))
                for _ in range(4)]

    def val_data(self, batch_size: int) -> Any:
        return self.train_data(batch_size, {})


def test_custom_op_is_listed_not_counted_as_zero() -> None:
    r = predict(MixTask(), batch_size=8, target=None, max_batch=False)
    ops = {u["op"]: u for u in r.uncounted_ops}
    assert "proftune_test::mix" in ops
    assert ops["proftune_test::mix"]["calls"] == 1
    assert [[8, 16], [16, 8]] in ops["proftune_test::mix"]["shapes"]
    # the Linear head is still counted: 2 * 8 * 8 * 3 forward FLOPs
    assert r.flops == 2 * 8 * 8 * 3

    counts = count_model(MixNet(), torch.randn(4, 16), backward=True)
    assert [u["op"] for u in counts.uncounted_ops] == ["proftune_test::mix"]
    assert counts.uncounted_ops[0]["calls"] == 1

    prof = proftune.profile(MixTask(), batch_size=8, steps=1, device="cpu")
    assert [u["op"] for u in prof.uncounted_ops] == ["proftune_test::mix"]
    again = Profile.from_dict(json.loads(prof.to_json()))
    assert again.uncounted_ops == prof.uncounted_ops


def test_old_profile_json_without_uncounted_ops_loads() -> None:
    d = Profile().to_dict()
    del d["uncounted_ops"]
    assert Profile.from_dict(d).uncounted_ops == ()


# -- largest batch and batch-size from the prediction ------------------------------------------------------


def test_largest_batch_uses_the_budget_and_margin() -> None:
    r = predict("digits-mlp", batch_size=32, target=None, device_memory="20MB")
    assert r.fits is True
    assert r.max_batch_size is not None
    assert r.max_batch_size > 32
    assert r.max_batch is not None
    margin = r.max_batch["model"]["margin_bytes"]
    assert margin >= 0.005 * 20e6 - 1  # batch-size's smallest margin
    # the answer's traced peak fits; one more sample's does not, with the margin
    at_answer = [p for p in r.max_batch["probes"] if p["batch_size"] == r.max_batch_size]
    assert at_answer
    assert at_answer[0]["peak_bytes"] <= 20e6
    above = predict("digits-mlp", batch_size=r.max_batch_size + 1, target=None, max_batch=False)
    assert above.memory.peak_bytes + margin > 20e6


def test_find_batch_size_from_prediction_runs_one_real_step() -> None:
    # 3 MB binds below digits-mlp's 1437 training samples (a step over all of them peaks ~3.6 MB)
    r = proftune.find_batch_size("digits-mlp", memory_budget="3MB", device="cpu", from_prediction=True)
    assert r.limited_by == "memory"
    assert r.runs == 1
    assert r.measured_peak_bytes is not None
    assert r.measured_peak_bytes <= 3e6
    assert r.measured_peak_bytes >= 0.9 * 3e6


def test_largest_batch_when_the_optimizer_step_holds_the_peak() -> None:
    from proftune.predict._api import _largest_batch

    # forward/backward grow 10 bytes per sample, the optimizer's peak is flat and the highest at
    # small batches: a single line through the step's peaks would extrapolate from a slope of 0
    def trace_at(b: int) -> tuple[int, dict[str, int]]:
        phases = {"forward": 500 + 8 * b, "backward": 600 + 10 * b, "optimizer": 900}
        return max(phases.values()), phases

    found = _largest_batch(trace_at, 1000, 1)
    margin = found["model"]["margin_bytes"]
    assert found["binding_phase"] == "backward"
    assert found["max_batch_size"] == int((1000 - margin - 600) // 10)
    assert len(found["probes"]) <= 4


def test_verify_prediction_rescales_an_underestimate() -> None:
    budget = 1000_000
    true = MemoryModel(100_000, 1100.0, 0.0, 5000.0, 2)     # the real step: 10% more per sample
    predicted = MemoryModel(100_000, 1000.0, 0.0, 5000.0, 2)
    answer = predicted.largest_batch(budget)

    def measure(b: int) -> int:
        return int(true.predict(b))

    result = verify_prediction(measure, budget, predicted, answer)
    assert result is not None
    assert result.probes[0].status == "over_budget"
    assert result.measured_peak_bytes is not None
    assert result.measured_peak_bytes <= budget
    assert result.runs <= 3
    assert result.max_batch_size >= 0.97 * true.largest_batch(budget)


# -- a 7B decoder without allocating it -------------------------------------------------------------------


@pytest.mark.slow
def test_7b_llama_predicted_without_allocation() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    r = predict(Llama7B(), batch_size=1, target="h200", precision="bf16", optimizer="adamw", max_batch=False)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    n = r.params.total
    assert 6.7e9 < n < 6.8e9
    assert r.memory.params_bytes == 4 * n
    assert r.memory.grads_bytes == 4 * n
    assert r.memory.optimizer_bytes == 8 * n
    assert r.memory.peak_bytes > r.memory.static_bytes
    assert grown < 4 * 2**30, grown  # a materialised model alone would be 27 GB
    assert r.step.time_ms is not None
    assert r.bound in ("compute", "memory")


# -- bad input exits 2 -----------------------------------------------------------------------------------


def test_unknown_target_lists_the_valid_ones() -> None:
    out = runner.invoke(app, ["predict", "digits-mlp", "--batch-size", "8", "--target", "h900"])
    assert out.exit_code == 2
    assert "h900" in out.output
    assert "h200" in out.output
    assert "a100" in out.output


@pytest.mark.parametrize("memory", ["-5GiB", "0", "lots"])
def test_bad_memory_exits_2(memory: str) -> None:
    out = runner.invoke(app, ["predict", "digits-mlp", "--batch-size", "8", "--device-memory", memory])
    assert out.exit_code == 2
    assert "--device-memory" in out.output  # the library names device_memory; the CLI its flag


def test_resolve_target_overrides_and_custom() -> None:
    spec = resolve_target("a100", memory="40GiB")
    assert spec.memory_bytes == 40 * 2**30
    assert spec.peak_tflops["bf16"] == 312.0
    custom = resolve_target(None, memory="8GiB", peak_tflops=10, bandwidth="500GB")
    assert custom.bandwidth_bytes_s == 500e9
    assert custom.tflops("bf16") == 10


def test_batch_that_does_not_fit_exits_2_with_the_largest_that_does() -> None:
    out = runner.invoke(app, ["predict", "digits-mlp", "--batch-size", "100000", "--device-memory", "20MB"])
    assert out.exit_code == 2
    assert "does not fit" in out.output
    assert "largest batch that fits is" in out.output
    none = runner.invoke(app, ["predict", "digits-mlp", "--batch-size", "8", "--device-memory", "10kB"])
    assert none.exit_code == 2
    assert "no batch size fits" in none.output
    zero = runner.invoke(app, ["predict", "digits-mlp", "--batch-size", "0"])
    assert zero.exit_code == 2
    assert "batch_size" in zero.output


def test_json_is_one_object() -> None:
    out = runner.invoke(app, ["predict", "digits-mlp", "--batch-size", "16", "--target", "h100", "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.stdout)
    assert d["target"]["name"] == "h100"
    assert d["fits"] is True
    assert d["real_steps"] == 0
    assert d["step"]["time_ms"] > 0
    assert {lay["bound"] for lay in d["layers"]} <= {"compute", "memory", "overhead",
                                                                                 "unknown"}


def test_grad_accumulation_is_traced_as_the_fit_loop_runs_it() -> None:
    """The predictor runs the fit loop's own step (train.run_step): with 4 micro-batches the
    gradients of the first live through the later ones, so the peak is higher than one micro-batch's
    step, and it matches the measured step with accumulation; the time is the step's, the FLOPs
    one micro-batch's (as count_model counts them)."""
    one = predict("digits-cnn", {"grad_accumulation": 1}, batch_size=32, target="a100", max_batch=False)
    four = predict("digits-cnn", {"grad_accumulation": 4}, batch_size=32, target="a100", max_batch=False)
    measured = _measured_with("digits-cnn", {"grad_accumulation": 4}, 32)
    assert abs(four.memory.peak_bytes / measured - 1) < 0.03, (four.memory.peak_bytes, measured)
    assert four.memory.peak_bytes > one.memory.peak_bytes  # one micro-batch's trace misses the live grads
    assert abs(one.memory.peak_bytes / measured - 1) > 0.03
    assert four.flops == one.flops
    assert four.step.forward_ms is not None
    assert one.step.forward_ms is not None
    assert 3.0 < four.step.forward_ms / one.step.forward_ms < 4.5
    assert four.step.optimizer_ms == pytest.approx(one.step.optimizer_ms)
    out = runner.invoke(app, ["predict", "digits-cnn", "--batch-size", "32", "--target", "a100", "-p",
                              "grad_accumulation=4"])
    assert out.exit_code == 0, out.output
    assert "batch 32 x 4 micro-batches per step" in out.output


def test_fp16_traces_the_grad_scaler_the_fit_loop_uses() -> None:
    """At fp16 the fit loop's step unscales the gradients (GradScaler) before clipping and the
    optimizer: the predicted step has those ops, bf16's (no scaler) does not."""
    from proftune.predict import StepTracer

    task = proftune.load_task("digits-cnn")
    params = dict(task.default_params)
    ops = {}
    for precision in ("bf16", "fp16"):
        trace = StepTracer(task, {**params, "precision": precision}, precision=precision).trace(16)
        ops[precision] = sum(1 for op in trace.ops if op.phase == "optimizer")
    assert ops["fp16"] > ops["bf16"]
    bf16 = predict("digits-cnn", {"precision": "bf16"}, batch_size=16, target="a100", max_batch=False)
    fp16 = predict("digits-cnn", {"precision": "fp16"}, batch_size=16, target="a100", max_batch=False)
    assert fp16.step.optimizer_ms is not None
    assert bf16.step.optimizer_ms is not None
    assert fp16.step.optimizer_ms > bf16.step.optimizer_ms
