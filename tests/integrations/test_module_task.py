"""A plain nn.Module (a timm model, a user's class, instance or factory) and ``timm:NAME`` as
tasks through the commands: synthetic data of the model's input shape, learnable labels."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("timm")

from typer.testing import CliRunner

from proftune import fit, load_task
from proftune.cli import app
from proftune.exceptions import ConfigError, DependencyError, TaskLoadError
from proftune.integrations import ModuleTask
from proftune.integrations._module_task import parse_input_shape

FILE = str(Path(__file__).parent / "module_files.py")


def cli(*args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, [*args, "--json", "--device", "cpu"])
    out = json.loads(result.stdout) if result.exit_code == 0 else {}
    return result.exit_code, out, result.stderr


def test_profile_a_file_whose_factory_returns_a_timm_model(tmp_path: Path) -> None:
    code, out, err = cli("profile", f"{FILE}:make", "--steps", "2", "-p", "input_shape=3x32x32",
                         "-p", "batch_size=8", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 0, err
    assert out["task"] == "make"
    import timm

    model = timm.create_model("resnet10t", pretrained=False, num_classes=10)
    assert out["params"]["total"] == sum(p.numel() for p in model.parameters())
    assert out["macs"] > 0


def test_timm_spec_trains_one_epoch_and_reports_accuracy(tmp_path: Path) -> None:
    code, out, err = cli("train", "timm:test_resnet", "--epochs", "1", "-p", "input_shape=3x32x32",
                         "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 0, err
    assert out["task"] == "timm:test_resnet"
    assert out["samples"] == 512
    assert 0.0 <= out["metrics"]["accuracy"] <= 1.0
    assert out["metrics"]["val_loss"] > 0


def test_shape_from_timm_cfg_small_for_cnns_own_for_vits() -> None:
    cnn = load_task(f"{FILE}:make")
    assert isinstance(cnn, ModuleTask)
    assert (cnn.shape, cnn.classes) == ((3, 64, 64), 10)  # cfg 224 cut to 64: any size works
    vit = load_task("timm:test_vit")
    assert (vit.shape, vit.classes) == ((3, 160, 160), 10)  # fixed input size: the cfg's
    small = load_task(f"{FILE}:make_vit")
    assert (small.shape, small.classes) == ((3, 32, 32), 4)  # its own img_size


def test_timm_params_reach_create_model() -> None:
    task = load_task("timm:test_vit")
    model = task.build_model({"img_size": 32, "num_classes": 3})
    assert model.num_classes == 3
    assert (task.shape, task.classes) == ((3, 32, 32), 3)
    x, y = next(iter(task.val_data(4)))
    assert x.shape == (4, 3, 32, 32)
    assert int(y.max()) < 3
    assert model(x).shape == (4, 3)
    with pytest.raises(ConfigError, match="input_shape"):  # a CNN takes no img_size
        load_task("timm:resnet10t").build_model({"img_size": 32})


def test_plain_class_with_input_shape_param_learns(tmp_path: Path) -> None:
    code, out, err = cli("train", f"{FILE}:ConvNet", "--epochs", "3", "-p", "input_shape=3x16x16",
                         "-p", "lr=0.01", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 0, err
    assert out["metrics"]["accuracy"] > 0.5  # 5 classes: chance is 0.2


def test_no_input_shape_exits_2_naming_the_param(tmp_path: Path) -> None:
    code, _, err = cli("profile", f"{FILE}:ConvNet", "--steps", "2", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 2
    assert "--param input_shape=3x32x32" in err
    with pytest.raises(ConfigError) as exc:  # the library names its own argument, params=
        load_task(f"{FILE}:ConvNet").build_model({})
    assert "give it as params={'input_shape': '3x32x32'}" in str(exc.value)
    assert "--" not in str(exc.value)
    code, _, err = cli("profile", f"{FILE}:ConvNet", "--steps", "2", "-p", "input_shape=3xfoo",
                       "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 2
    assert "input_shape='3xfoo'" in err


def test_instance_with_a_first_linear_needs_no_shape_and_is_copied() -> None:
    task = load_task(f"{FILE}:mlp")
    assert (task.shape, task.classes) == ((20,), 4)
    a, b = task.build_model({}), task.build_model({})
    assert a is not b
    result = fit(task, params={"lr": 0.01}, epochs=2, device="cpu")
    assert result.metrics["accuracy"] > 0.5  # 4 classes: chance is 0.25


def test_unknown_timm_name_exits_2_with_close_names(tmp_path: Path) -> None:
    code, _, err = cli("profile", "timm:resnet18x", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 2
    assert "'resnet18x'" in err
    assert "resnet18" in err.split("close names:")[1]
    with pytest.raises(TaskLoadError, match=r"close names: .*resnet"):
        load_task("timm:resnt18")


def test_missing_timm_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)
    with pytest.raises(DependencyError, match=r"proftune\[timm\]"):
        load_task("timm:resnet18")


def test_data_is_seeded_and_independent_of_batch_size() -> None:
    task = load_task(f"{FILE}:mlp")
    x8 = torch.cat([x for x, _ in task.val_data(8)])
    x100 = torch.cat([x for x, _ in task.val_data(100)])
    assert torch.equal(x8, x100)
    assert len(task.val_data(100)) == 3
    assert x8.shape == (256, 20)
    assert parse_input_shape("3,32,32") == (3, 32, 32)
    assert parse_input_shape(64) == (64,)


def test_batch_size_under_a_memory_budget(tmp_path: Path) -> None:
    code, out, err = cli("batch-size", f"{FILE}:ConvNet", "-p", "input_shape=3x16x16", "--memory-budget", "64MB",
                         "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 0, err
    assert out["max_batch_size"] >= 32


def test_a_timm_entrypoint_by_module_path() -> None:
    task = load_task("timm.models.resnet:resnet10t")  # resnet10t(pretrained=False, **kwargs) -> ResNet
    assert isinstance(task, ModuleTask)
    assert (task.shape, task.classes) == ((3, 64, 64), 1000)


def test_torchscript_of_a_timm_model_reads_back_as_torchscript(tmp_path: Path) -> None:
    """Its archive holds code/__torch__/timm/models/...: not a torch.export archive's models/."""
    from proftune.compress._checkpoint import file_format, load_model, save_model

    model = load_task("timm:test_resnet").build_model({"input_shape": "3x32x32"}).eval()
    x = torch.randn(2, 3, 32, 32)
    save_model(model, tmp_path / "m.pt", x, fmt="torchscript")
    assert file_format(tmp_path / "m.pt") == "torchscript"
    assert torch.allclose(load_model(tmp_path / "m.pt")(x), model(x), atol=1e-5)
    save_model(model, tmp_path / "e.pt", x, fmt="export")
    assert file_format(tmp_path / "e.pt") == "export"
