"""A model with BatchNorm1d at batch 1: an inference profile runs it in eval mode everywhere (static
counts included); a training profile exits 2 naming the layer and the smallest batch that works."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import proftune
from proftune.cli import app
from proftune.exceptions import ConfigError

BN_TASK = '''
import torch
from torch import nn
import proftune


class BatchNormMLP(proftune.Task):
    name = "bn-mlp"

    def build_model(self, params):
        return nn.Sequential(nn.Linear(8, 16), nn.Sequential(nn.BatchNorm1d(16)), nn.ReLU(), nn.Linear(16, 3))

    def train_data(self, batch_size, params):
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(batch_size, 8, generator=g), torch.randint(0, 3, (batch_size,), generator=g))
                for _ in range(4)]

    def val_data(self, batch_size):
        return self.train_data(batch_size, {})

    def loss(self, model, batch):
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)
'''

runner = CliRunner()


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def test_inference_profile_at_batch_1_counts_in_eval_mode() -> None:
    model = _bn_model()
    stats = {k: v.clone() for k, v in model.state_dict().items()}
    p = proftune.profile(model, example_input=torch.randn(1, 8), inference=True, steps=1, warmup=0,
                         device="cpu")
    assert p.mode == "inference"
    assert p.batch_size == 1
    assert p.macs == 8 * 16 + 16 * 3  # the two Linear layers at batch 1
    assert all(torch.equal(stats[k], v) for k, v in model.state_dict().items())  # untouched


def test_training_profile_at_batch_1_names_the_layer_and_the_smallest_batch() -> None:
    with pytest.raises(ConfigError) as err:
        proftune.profile(_bn_model(), example_input=torch.randn(1, 8), steps=1, warmup=0, device="cpu")
    text = str(err.value)
    assert "layer '1'" in text
    assert "BatchNorm1d" in text
    assert "smallest batch size that works is 2" in text
    p = proftune.profile(_bn_model(), example_input=torch.randn(2, 8), steps=1, warmup=0, device="cpu",
                         detail="step")
    assert p.batch_size == 2
    assert p.macs == 2 * (8 * 16 + 16 * 3)


def test_cli_batch_1_inference_exits_0_training_exits_2(tmp_path: Path) -> None:
    task = tmp_path / "bn_task.py"
    task.write_text(BN_TASK)
    db = f"sqlite:///{tmp_path / 'p.db'}"
    common = ["profile", str(task), "--batch-size", "1", "--steps", "1", "--warmup", "0", "--device", "cpu",
              "--db", db]
    res = runner.invoke(app, [*common, "--inference", "--json"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, common)
    assert res.exit_code == 2, res.output
    assert "'1.0'" in res.output
    assert "smallest batch size that works is 2" in res.output


@pytest.mark.slow
def test_timm_levit_inference_at_batch_1() -> None:
    timm = pytest.importorskip("timm")
    model = timm.create_model("levit_128s", pretrained=False)
    p = proftune.profile(model, example_input=torch.randn(1, 3, 224, 224), inference=True, steps=1,
                         warmup=0, device="cpu", detail="step")
    assert p.mode == "inference"
    assert 0.2e9 < p.macs < 0.4e9  # timm lists levit_128s at 0.31 GMACs
