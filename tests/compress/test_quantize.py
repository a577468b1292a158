"""Quantization backends, save formats that reload with identical outputs, availability errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from proftune.compress import (
    QUANT_BACKENDS,
    BaseQuantBackend,
    _quantize,
    backend_status,
    load_model,
)
from proftune.compress._checkpoint import Rebuild, save_model
from proftune.compress._quant_backends import QuantInputs, get_backend
from proftune.compress._quantize import quantize_static, run_batches


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).eval()


@pytest.mark.parametrize("backend", ["torch.ao", "torchao"])
def test_dynamic_int8_saves_smaller_and_reloads_identically(backend: str, tmp_path: Path) -> None:
    model = _mlp()
    x = torch.randn(5, 64)
    found = get_backend(backend, "dynamic")
    assert found is not None
    q = found.quantize(model, QuantInputs())
    fp_path, q_path = tmp_path / "fp.pt", tmp_path / "q.pt"
    save_model(model, fp_path, x, fmt="state", rebuild=Rebuild(task=None))
    save_model(q, q_path, x, fmt=found.save_format)
    loaded = load_model(q_path)
    with torch.no_grad():
        assert torch.equal(loaded(x), q(x))
        assert (loaded(x) - model(x)).abs().max() < 0.1  # INT8 error, not garbage
        assert loaded(torch.randn(1, 64)).shape == (1, 10)  # any batch size after reload
    if backend == "torch.ao":  # a tiny model: torch.export's program text outweighs the weights
        assert q_path.stat().st_size < fp_path.stat().st_size / 2


def test_static_int8_fuses_and_calibrates_a_conv_model(tmp_path: Path) -> None:
    from proftune.task import load_task

    task = load_task("digits-cnn")
    torch.manual_seed(0)
    model = task.build_model({}).eval()
    x = torch.randn(4, 1, 8, 8)
    q = quantize_static(model, x, run_batches(task.loss, task.train_data(32, {}), 2))
    names = {type(m).__name__ for m in q.modules()}
    assert "ConvReLU2d" in names  # conv-bn-relu fused into one INT8 op
    path = tmp_path / "s.pt"
    save_model(q, path, x, fmt="torchscript")
    with torch.no_grad():
        assert torch.equal(load_model(path)(x), q(x))


def test_backend_status_names_why_a_backend_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = backend_status("static", torch.device("cuda"))
    assert cuda["torch.ao"] is not None
    assert "CPU only" in cuda["torch.ao"]
    assert cuda["torchao"] is not None  # no eager static INT8 for conv in torchao
    monkeypatch.setattr(_quantize, "supported_engines", lambda: ["none"])
    cpu = backend_status("dynamic", torch.device("cpu"))
    assert cpu["torch.ao"] is not None
    assert "engine" in cpu["torch.ao"]
    assert cpu["torchao"] is None


def test_qat_trains_fake_quantized_with_the_fit_loop_then_converts(tmp_path: Path) -> None:
    from proftune import fit
    from proftune.compress._quantize import convert_qat, prepare_qat
    from proftune.task import load_task

    task = load_task("digits-cnn")
    torch.manual_seed(0)
    model = task.build_model({"width": 8})
    x = torch.randn(4, 1, 8, 8)
    prepared = prepare_qat(model, x)
    assert any("FakeQuantize" in type(m).__name__ for m in prepared.modules())
    before = {k: v.clone() for k, v in prepared.state_dict().items() if v.is_floating_point()}
    fit(task, {}, model=prepared, max_steps=3, device="cpu", evaluate=False)
    assert any(not torch.equal(before[k], v) for k, v in prepared.state_dict().items() if k in before)
    q = convert_qat(prepared)
    path = tmp_path / "qat.pt"
    save_model(q, path, x, fmt="torchscript")
    with torch.no_grad():
        assert torch.equal(load_model(path)(x), q(x))


def test_every_backend_follows_the_base_class_contract() -> None:
    """One list holds every backend; each says why it cannot run, or quantizes a tiny model."""
    assert {(b.name, b.method) for b in QUANT_BACKENDS} >= {("torch.ao", "dynamic"), ("torch.ao", "static"),
                                                      ("torch.ao", "qat"), ("torchao", "dynamic")}
    cpu = torch.device("cpu")
    for backend in QUANT_BACKENDS:
        assert isinstance(backend, BaseQuantBackend)
        assert backend.save_format in ("torchscript", "export")
        assert backend.available(cpu) == (backend.unavailable(cpu) is None)
    dynamic = [b for b in QUANT_BACKENDS if b.method == "dynamic" and b.available(cpu)]
    assert dynamic, "no dynamic INT8 backend on CPU"
    model, x = _mlp(), torch.randn(3, 64)
    for backend in dynamic:
        from proftune.compress import QuantInputs

        q = backend.quantize(model, QuantInputs(example=x))
        with torch.no_grad():
            assert (q(x) - model(x)).abs().max() < 0.1
        assert all(type(m) is nn.Linear for m in model.modules() if isinstance(m, nn.Linear))  # untouched


def test_asking_for_torchao_writes_nothing_to_stderr() -> None:
    """torchao's import logs a deprecation of torch's own (``register_constant()`` on an Enum) to
    stderr: the first line a newcomer's quickstart printed. A fresh interpreter, so the import is
    not already done."""
    import subprocess
    import sys

    code = ("import torch\nfrom proftune.compress._quant_backends import TorchaoDynamic\n"
            "print(TorchaoDynamic().unavailable(torch.device('cpu')))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert res.stdout.strip() in ("None", "torchao is not installed (pip install 'proftune[quant]')")
    assert "register_constant" not in res.stderr
    assert res.stderr.strip() == ""
