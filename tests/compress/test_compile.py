"""The compiler step: ONNX Runtime and AOTInductor candidates measured like every other, fp16,
and the --target presets."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import proftune
from proftune import fit
from proftune.cli import app
from proftune.compress._plan import TARGETS, LayerShare, ProfileSummary, TypeShare, plan_methods
from proftune.examples._digits import DigitsMLP
from proftune.exceptions import ConfigError

FAST = {"latency_rounds": 1, "finetune_epochs": 0, "layer_times": False, "params": {"hidden": 256}}
HAS_ORT = all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime", "onnxscript"))


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("orig") / "original.pt"
    model = fit("digits-mlp", {"hidden": 256}, epochs=2, seed=0, device="cpu").model.eval()
    torch.save(model.state_dict(), path)
    return path


@pytest.mark.skipif(not HAS_ORT, reason="onnx, onnxruntime and onnxscript are not installed")
def test_onnxruntime_and_fp16_candidates_are_measured_checked_and_saved_with_their_load_line(
        original: Path, tmp_path: Path, db_url: str) -> None:
    import onnxruntime as ort

    out = tmp_path / "selected.onnx"
    report = proftune.compress("digits-mlp", model=str(original), compile=("onnxruntime",), half=True,
                               max_accuracy_drop=0.5, goal="size", out=str(out), db=db_url, device="cpu", **FAST)
    by = {c.method: c for c in report.candidates}
    assert set(by) == {"onnxruntime", "fp16"}
    onnx, half = by["onnxruntime"], by["fp16"]
    base = report.baseline
    assert onnx.format == "onnx"
    assert onnx.eager_max_abs_diff is not None
    assert onnx.eager_max_abs_diff < 1e-4  # the same function as the eager model on every validation batch
    assert onnx.metric == pytest.approx(base.metric, abs=1e-9)
    assert onnx.params == base.params
    assert onnx.latency_ms > 0
    assert onnx.latency_batch_ms > 0
    assert onnx.size_bytes >= 4 * base.params  # the weights are inside the one file
    assert any("CPUExecutionProvider" in n for n in onnx.notes)
    assert half.format == "export"
    assert half.size_bytes < 0.7 * base.size_bytes  # fp16 weights: half the bytes (+ the graph)
    assert half.reload_max_abs_diff < 1e-2
    assert all(isinstance(c.pareto, bool) for c in report.candidates)
    # the goal is size: fp16 or onnx, whichever file is smaller; the output runs as the load line says
    assert report.selected is not None
    assert report.selected.size_bytes == min(c.size_bytes for c in report.candidates)
    if report.selected.method == "onnxruntime":
        assert "onnxruntime" in (report.load_line or "")
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        x = next(iter(proftune.load_task("digits-mlp").val_data(8)))[0]
        model = DigitsMLP().build_model({"hidden": 256})
        model.load_state_dict(torch.load(original, weights_only=True))
        got = session.run(None, {"input0": x.numpy()})[0]
        assert torch.allclose(torch.from_numpy(got), model.eval()(x), atol=1e-4)


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if float(x.sum()) > 0:  # data-dependent Python control flow: no graph exporter can take it
            return self.fc(x)
        return -self.fc(x)


class BranchyTask(DigitsMLP):
    name = "branchy"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _Branchy()


@pytest.mark.skipif(not HAS_ORT, reason="onnx, onnxruntime and onnxscript are not installed")
def test_a_model_the_exporter_cannot_take_is_skipped_with_a_note(db_url: str) -> None:
    report = proftune.compress(BranchyTask(), compile=("onnxruntime",), baseline_epochs=1, db=db_url,
                               device="cpu", **{**FAST, "params": {}})
    assert report.candidates == []
    assert any("onnxruntime could not compile" in n for n in report.notes), report.notes


def test_bad_compile_and_target_names_list_the_valid_choices() -> None:
    with pytest.raises(ConfigError) as exc:
        proftune.compress("digits-mlp", compile=("tvm",), target="phone", device="cpu")
    text = str(exc.value)
    assert "compile='tvm' is unknown; valid: inductor, onnxruntime" in text  # the Python argument
    assert "target='phone' is unknown; valid: cpu, gpu, mobile, edge" in text
    out = CliRunner().invoke(app, ["compress", "digits-mlp", "--compile", "inductor,tvm"])
    assert out.exit_code == 2
    assert "--compile 'tvm' is unknown" in out.output  # the CLI says its flag


def _summary(conv_share: float) -> ProfileSummary:
    conv = LayerShare(name="0", type="Conv2d", params=3, macs=9, forward_ms=None, time_share=None, params_share=0.3,
                      macs_share=conv_share)
    return ProfileSummary(params=10, macs=10, batch_size=32, top_params=[conv], top_macs=[conv],
                          by_type={"Conv2d": TypeShare(macs_share=conv_share, params_share=0.3, time_share=0.5),
                                   "Linear": TypeShare(macs_share=1 - conv_share, params_share=0.7, time_share=0.3)})


@pytest.mark.parametrize(("target", "conv", "expected"), [
    ("gpu", 0.9, ("structured", None, True, ())),
    ("mobile", 0.9, ("structured", "static", False, ())),
    ("edge", 0.9, (None, "static", True, ())),
    ("edge", 0.1, (None, "dynamic", True, ())),
    ("cpu", 0.1, ("structured", "dynamic", False, ("onnxruntime",))),
])
def test_targets_pick_the_methods_of_the_hardware_table(target: str, conv: float,
                                                        expected: tuple[Any, ...]) -> None:
    plan = plan_methods(_summary(conv), prune=None, quant=None, quant_possible={"dynamic": True, "static": True},
                        target=target)
    assert (plan.prune, plan.quant, plan.half, plan.compile) == expected
    assert any(line.startswith(f"target {target}: {TARGETS[target].why}") for line in plan.lines)


def test_what_the_user_names_wins_over_the_target_and_a_missing_backend_is_skipped() -> None:
    plan = plan_methods(_summary(0.9), prune="unstructured", quant=None, quant_possible={"static": False},
                        target="mobile", compile=("inductor",))
    assert plan.prune == "unstructured"
    assert plan.quant is None  # mobile's static INT8 has no backend here
    assert any("static INT8 skipped" in line for line in plan.lines)
    assert plan.compile == ("inductor",)


@pytest.mark.slow
def test_inductor_compiles_an_aot_package_that_agrees_with_eager(original: Path, db_url: str) -> None:
    report = proftune.compress("digits-mlp", model=str(original), compile=("inductor",), db=db_url, device="cpu",
                               **FAST)
    (cand,) = report.candidates
    assert cand.method == "inductor"
    assert cand.format == "aoti"
    assert cand.eager_max_abs_diff is not None
    assert cand.eager_max_abs_diff < 1e-4
    assert cand.metric == pytest.approx(report.baseline.metric, abs=1e-9)
    assert cand.latency_ms > 0
