"""ONNX export of a model (``profile --onnx``): the file ONNX Runtime runs, outputs equal to torch's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from proftune.compress import export_onnx
from proftune.exceptions import ConfigError, DependencyError

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 3))


def test_export_runs_in_onnxruntime_and_matches(tmp_path: Path) -> None:
    model = _cnn().train()
    x = torch.randn(5, 1, 8, 8)
    out = export_onnx(model, x, tmp_path / "m.onnx")
    assert out.checked
    assert out.matches
    assert out.outputs == 1
    assert out.inputs == ("input0",)
    assert out.max_abs_diff is not None
    assert out.max_abs_diff < 1e-4
    assert (tmp_path / "m.onnx").stat().st_size == out.size_bytes > 4 * 9
    assert model.training  # its mode is given back
    import onnx

    graph = onnx.load(str(tmp_path / "m.onnx")).graph
    assert any(node.op_type == "Conv" for node in graph.node)
    # a dynamic batch dimension: another batch size runs too
    import onnxruntime as ort

    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    y = sess.run(None, {"input0": torch.randn(2, 1, 8, 8).numpy()})[0]
    assert y.shape == (2, 3)


def test_keyword_inputs(tmp_path: Path) -> None:
    class Kw(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(3, 2), nn.Linear(4, 2)

        def forward(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.a(x) + self.b(z), self.b(z)

    out = export_onnx(Kw(), {"x": torch.randn(2, 3), "z": torch.randn(2, 4)}, tmp_path / "kw.onnx")
    assert out.inputs == ("x", "z")
    assert out.outputs == 2
    assert out.matches


def test_bad_path_existing_file_and_missing_dependency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(2, 1, 8, 8)
    with pytest.raises(ConfigError, match=r"\.onnx"):
        export_onnx(_cnn(), x, tmp_path / "m.pt")
    (tmp_path / "there.onnx").write_text("keep me")
    with pytest.raises(ConfigError, match="exists"):
        export_onnx(_cnn(), x, tmp_path / "there.onnx")
    assert (tmp_path / "there.onnx").read_text() == "keep me"
    with pytest.raises(ConfigError, match="atol"):
        export_onnx(_cnn(), x, tmp_path / "a.onnx", atol=-1)
    from proftune.compress._compile import OnnxRuntime

    monkeypatch.setattr(OnnxRuntime, "unavailable",
                        lambda self, device: "onnx not installed (pip install 'proftune[compile]')")
    with pytest.raises(DependencyError, match=r"proftune\[compile\]"):
        export_onnx(_cnn(), x, tmp_path / "b.onnx")
    assert not list(tmp_path.glob("*b*.onnx"))
