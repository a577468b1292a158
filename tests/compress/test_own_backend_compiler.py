"""A quantization backend and a compiler of one's own, each added from outside the package by one
class and its registration: both are valid on the command line (``--quant-backend``,
``--compile``), measured like every other candidate, and show up in the JSON and the report."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from proftune import fit
from proftune.cli import app
from proftune.compress import (
    COMPILER_REGISTRY,
    COMPILERS,
    QUANT_BACKEND_REGISTRY,
    QUANT_BACKENDS,
    BaseCompiler,
    BaseQuantBackend,
    ExportedModule,
    QuantInputs,
    register_compiler,
    register_quant_backend,
)
from proftune.compress._compile import load_line_of
from proftune.exceptions import ConfigError


class Grid8(BaseQuantBackend):
    """Symmetric per-tensor INT8 weight grid, kept in float (simulated quantization): the same
    model class, so it saves as a state dict."""

    name = "grid8"
    method = "dynamic"
    save_format = "state"

    def unavailable(self, device: torch.device, model: nn.Module | None = None) -> str | None:
        return None

    def quantize(self, model: nn.Module, inputs: QuantInputs) -> nn.Module:
        import copy

        out = copy.deepcopy(model).eval()
        with torch.no_grad():
            for p in out.parameters():
                scale = p.abs().max().clamp(min=1e-12) / 127
                p.copy_(torch.round(p / scale).clamp(-127, 127) * scale)
        return out


class ExportEngine(BaseCompiler):
    """torch.export with a dynamic batch, saved as a .pt2e program and loaded back as a module."""

    name = "export-engine"
    save_format = "exported-program"
    suffix = ".pt2e"
    load_line = "import torch; model = torch.export.load({path!r}).module()"

    def unavailable(self, device: torch.device) -> str | None:
        return None

    def compile(self, model: nn.Module, example: Any, path: Path, *, device: torch.device) -> None:
        args = tuple(example) if isinstance(example, (tuple, list)) else (example,)
        batch = torch.export.Dim.DYNAMIC
        program = torch.export.export(model, args, dynamic_shapes=tuple({0: batch} for _ in args))
        torch.export.save(program, str(path))

    def load(self, path: Path, *, device: torch.device, threads: int | None) -> nn.Module:
        return ExportedModule(torch.export.load(str(path)).module())  # takes .eval() and .to()


@pytest.fixture(scope="module")
def plugins() -> Iterator[None]:
    register_quant_backend(Grid8)
    register_compiler(ExportEngine)
    yield
    QUANT_BACKEND_REGISTRY.remove("grid8:dynamic")
    COMPILER_REGISTRY.remove("export-engine")


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("orig") / "original.pt"
    torch.save(fit("digits-mlp", {"hidden": 64}, epochs=2, seed=0, device="cpu").model.state_dict(), path)
    return path


@pytest.mark.usefixtures("plugins")
def test_own_backend_and_compiler_on_the_command_line_json_and_report(original: Path, tmp_path: Path) -> None:
    assert any(isinstance(b, Grid8) for b in QUANT_BACKENDS)
    assert any(isinstance(c, ExportEngine) for c in COMPILERS)
    report = tmp_path / "r.html"
    res = CliRunner().invoke(app, [
        "compress", "digits-mlp", "--model", str(original), "--quantize", "dynamic", "--quant-backend", "grid8",
        "--compile", "export-engine", "--goal", "size", "--max-accuracy-drop", "0.5", "--finetune-epochs", "0",
        "--param", "hidden=64", "--device", "cpu", "--db", f"sqlite:///{tmp_path / 'p.db'}",
        "--report", str(report), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    by = {c["method"]: c for c in d["candidates"]}
    quant = by["dynamic"]
    assert quant["quant_backend"] == "grid8"
    assert quant["backend_ms"]["torch.ao"] == "not requested"  # only the named library ran
    assert quant["format"] == "state"
    assert quant["reload_max_abs_diff"] == 0.0
    compiled = by["export-engine"]
    assert compiled["format"] == "exported-program"
    assert compiled["eager_max_abs_diff"] < 1e-4  # the same function as the eager model on validation data
    assert compiled["params"] == d["baseline"]["params"]
    page = report.read_text()
    assert "grid8" in page
    assert "export-engine" in page
    assert load_line_of("exported-program") == ExportEngine.load_line


@pytest.mark.usefixtures("plugins")
def test_unknown_names_list_the_registered_plugins() -> None:
    res = CliRunner().invoke(app, ["compress", "digits-mlp", "--quantize", "dynamic", "--quant-backend", "nope",
                                   "--compile", "tvm"])
    assert res.exit_code == 2
    assert "grid8" in res.output
    assert "export-engine" in res.output


def test_bad_plugins_are_refused_with_every_problem() -> None:
    class Bad(BaseQuantBackend):
        name = "auto"
        method = "int4"
        save_format = "pickle"

        def unavailable(self, device: torch.device, model: nn.Module | None = None) -> str | None:
            return None

        def quantize(self, model: nn.Module, inputs: QuantInputs) -> nn.Module:
            return model

    with pytest.raises(ConfigError) as e:
        register_quant_backend(Bad)
    text = str(e.value)
    assert "other than 'auto'" in text
    assert "method='int4' is unknown" in text
    assert "save_format='pickle'" in text

    class NoLoad(ExportEngine):
        name = "no-load"
        load_line = None

    with pytest.raises(ConfigError, match="has no load line"):
        register_compiler(NoLoad)
    with pytest.raises(ConfigError, match=r"is not a proftune\.compress\.BaseCompiler"):
        register_compiler(object())
    assert "no-load" not in COMPILER_REGISTRY
