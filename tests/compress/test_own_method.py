"""A compression method of one's own, added from outside the package by one class and its
registration: it runs in compress(), is measured like every other candidate, and shows up in the
CLI (``--method``), the JSON and the report."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import proftune
from proftune import fit
from proftune.cli import app
from proftune.compress import COMPRESS_METHODS, BaseCompressMethod, MethodContext, register_method
from proftune.exceptions import ConfigError

FAST = {"latency_rounds": 1, "finetune_epochs": 0, "layer_times": False, "params": {"hidden": 64}}


class Round8(BaseCompressMethod):
    """Each weight rounded to 8 levels per tensor (a crude weight clustering): the same model class."""

    name = "round8"
    description = "weights rounded to 8 levels per tensor"
    save_format = "state"

    def apply(self, model: nn.Module, context: MethodContext) -> nn.Module:
        with torch.no_grad():
            for p in model.parameters():
                lo, hi = p.min(), p.max()
                step = (hi - lo) / 7 if hi > lo else torch.tensor(1.0)
                p.copy_(lo + torch.round((p - lo) / step) * step)
        return model


@pytest.fixture(scope="module")
def round8() -> Iterator[None]:
    register_method(Round8)
    yield
    COMPRESS_METHODS.remove("round8")


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("orig") / "original.pt"
    torch.save(fit("digits-mlp", {"hidden": 64}, epochs=2, seed=0, device="cpu").model.state_dict(), path)
    return path


@pytest.mark.usefixtures("round8")
def test_own_method_is_a_measured_candidate_in_json_and_report(original: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    result = proftune.compress("digits-mlp", model=str(original), methods=("round8",),
                               max_accuracy_drop=0.5, goal="size", db=db, **FAST)
    d = result.to_dict()
    own = [c for c in d["candidates"] if c["method"] == "round8"]
    assert len(own) == 1
    assert own[0]["reload_max_abs_diff"] == 0.0  # saved, reloaded, same outputs
    assert own[0]["params"] == d["baseline"]["params"]
    assert any("round8" in line for line in d["plan"])
    page = proftune.report.render_report(result, db=db)
    assert "round8" in page


@pytest.mark.usefixtures("round8")
def test_own_method_on_the_command_line(original: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, [
        "compress", "digits-mlp", "--model", str(original), "--method", "round8", "--goal", "size",
        "--max-accuracy-drop", "0.5", "--finetune-epochs", "0", "--param", "hidden=64",
        "--db", f"sqlite:///{tmp_path / 'p.db'}", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert "round8" in {c["method"] for c in d["candidates"]}


def test_unknown_or_bad_method_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"methods='nope' is unknown"):
        proftune.compress("digits-mlp", methods=("nope",), **FAST)

    class Bad(BaseCompressMethod):
        name = "a+b"
        save_format = "pickle"

        def apply(self, model: nn.Module, context: MethodContext) -> nn.Module:
            return model

    with pytest.raises(ConfigError) as e:
        register_method(Bad)
    assert "without '+'" in str(e.value)
    assert "save_format='pickle'" in str(e.value)
