"""`recommend --emit`: the computed parameters as the snippet a user pastes, and it runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from proftune.cli import app
from proftune.exceptions import ConfigError
from proftune.integrations import emit_snippet
from proftune.recommend import Recommendation


def recs(precision: str = "bf16") -> list[Recommendation]:
    return [Recommendation("batch_size", 96, "fits"), Recommendation("lr", 0.0031, "range test"),
            Recommendation("grad_accumulation", 4, "reach 384"), Recommendation("precision", precision, "fast"),
            Recommendation("data_loading", {"num_workers": 3, "pin_memory": True}, "waits")]


def test_lightning_snippet() -> None:
    text = emit_snippet(recs(), "lightning")
    assert 'L.Trainer(accumulate_grad_batches=4, precision="bf16-mixed")' in text
    assert "batch_size=96, lr=0.0031" in text
    L = pytest.importorskip("lightning")
    ns = {"L": L}
    exec(emit_snippet(recs("fp32"), "lightning"), ns)  # the pasted line builds a real Trainer
    assert ns["trainer"].accumulate_grad_batches == 4


def test_transformers_snippet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = emit_snippet(recs(), "transformers")
    assert ("per_device_train_batch_size=96, gradient_accumulation_steps=4, learning_rate=0.0031, "
            "bf16=True, dataloader_num_workers=3, dataloader_pin_memory=True") in text
    transformers = pytest.importorskip("transformers")
    monkeypatch.chdir(tmp_path)
    ns = {"TrainingArguments": transformers.TrainingArguments}
    exec(emit_snippet(recs("fp32"), "transformers"), ns)
    args = ns["args"]
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (96, 4)
    assert args.learning_rate == pytest.approx(0.0031)


def test_yaml_snippet_and_missing_values() -> None:
    body = yaml.safe_load(emit_snippet(recs(), "yaml"))
    assert body == {"batch_size": 96, "lr": 0.0031, "grad_accumulation": 4, "precision": "bf16",
                    "data_loading": {"num_workers": 3, "pin_memory": True}}
    text = emit_snippet([Recommendation("lr", None, "no suggestion")], "lightning")
    assert "not computed from the measurements: batch_size, grad_accumulation, lr, precision" in text
    with pytest.raises(ConfigError, match="valid: lightning, transformers, yaml"):
        emit_snippet(recs(), "keras")


def test_recommend_cli_emits(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'r.db'}"
    base = ["recommend", "digits-mlp", "--device", "cpu", "--memory-budget", "64MB", "--lr-steps", "20",
            "--noise-steps", "4", "--db", db]
    result = CliRunner().invoke(app, [*base, "--emit", "transformers"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("# proftune recommend, run ")
    assert "args = TrainingArguments(" in result.stdout
    assert "per_device_train_batch_size=" in result.stdout
    result = CliRunner().invoke(app, [*base, "--emit", "yml"])
    assert result.exit_code == 2
    assert "valid: lightning, transformers, yaml" in result.stderr
    result = CliRunner().invoke(app, [*base, "--emit", "yaml", "--json"])
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["emit"]["format"] == "yaml"
    assert "batch_size:" in out["emit"]["snippet"]
