"""A LightningModule file through the commands by file name alone: the adapter Task, in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")

from typer.testing import CliRunner

from proftune import fit, load_task
from proftune.cli import app
from proftune.exceptions import ConfigError
from proftune.integrations import LightningTask, task_with_data
from proftune.integrations._lightning_task import parse_optimizers

HERE = Path(__file__).parent
LIT = str(HERE / "lit_digits.py")
FIXED = str(HERE / "lit_fixed.py")


def cli(*args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, [*args, "--json", "--device", "cpu"])
    out = json.loads(result.stdout) if result.exit_code == 0 else {}
    return result.exit_code, out, result.stderr


def test_file_alone_pairs_module_with_its_datamodule() -> None:
    task = load_task(LIT)
    assert isinstance(task, LightningTask)
    assert task.name == "LitModel"
    assert task.default_params == {"batch_size": 64, "lr": 1e-2}  # the datamodule's hparam, the module's
    batch = next(iter(task.train_data(16, {})))
    assert batch[0].shape == (16, 64)  # batch size set on the datamodule, the tuner's way


def test_fit_trains_with_the_modules_optimizer_scheduler_and_logged_metrics() -> None:
    task = load_task(f"{LIT}:LitModel")
    result = fit(task, {"hidden": 32}, epochs=2, device="cpu", seed=0)
    assert result.model.net[0].out_features == 32  # the param reached the constructor
    assert isinstance(result.optimizer, torch.optim.Adam)
    # StepLR(gamma=0.99) stepped once per optimizer step ("interval": "step")
    assert result.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.99 ** result.steps)
    assert set(result.metrics) == {"val_loss", "accuracy"}  # what validation_step logged
    assert result.metrics["accuracy"] > 0.8


def test_lr_param_reaches_the_hparam_the_optimizer_reads() -> None:
    task = load_task(LIT)
    model = task.build_model({"lr": 0.05})
    opt = task.configure_optimizer(model, {"lr": 0.05})
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


def test_parse_optimizers_accepts_every_return_form() -> None:
    p = [torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD(p, lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    forms = [opt, [opt], (opt,), ([opt], [sched]), {"optimizer": opt},
             {"optimizer": opt, "lr_scheduler": sched}, [{"optimizer": opt, "lr_scheduler": {"scheduler": sched}}]]
    for form in forms:
        got, _ = parse_optimizers(form, owner="M")
        assert got is opt
    assert len(parse_optimizers(([opt], [sched]), owner="M")[1]) == 1
    with pytest.raises(ConfigError, match="2 optimizers"):
        parse_optimizers([opt, torch.optim.SGD(p, lr=0.1)], owner="M")
    with pytest.raises(ConfigError, match="returned None"):
        parse_optimizers(None, owner="M")


def test_modules_own_dataloaders_and_no_batch_size_anywhere() -> None:
    task = load_task(FIXED)
    assert task.default_params["batch_size"] == 32  # read from its DataLoader
    result = fit(task, max_steps=3, device="cpu")  # dict {"loss": ...} from training_step
    assert result.steps == 3
    with pytest.raises(ConfigError, match="neither FixedBatch") as err:
        task.train_data(64, {})
    assert "batch_size" in str(err.value)


def test_batch_size_command_exits_2_naming_both() -> None:
    code, _, err = cli("batch-size", f"{LIT}:LitModel", "--data", f"{FIXED}:FixedBatch", "--memory-budget", "1GiB")
    assert code == 2
    assert f"--data {FIXED + ':FixedBatch'!r} is FixedBatch, not a LightningDataModule" in " ".join(err.split())
    code, _, err = cli("batch-size", FIXED, "--memory-budget", "1GiB")
    assert code == 2
    assert "FixedBatch" in err
    assert "batch_size" in err


NO_DATA = '''
import torch
import lightning.pytorch as L


class NoData(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
'''


def test_data_errors_name_the_argument_and_the_cli_reads_the_flag(tmp_path: Path) -> None:
    """The library names ``data=`` (task_with_data's argument); the command line reads ``--data``."""
    with pytest.raises(ConfigError) as err:
        task_with_data(f"{LIT}:LitModel", f"{FIXED}:FixedBatch")
    assert str(err.value).startswith(f"data={FIXED + ':FixedBatch'!r} is FixedBatch")
    with pytest.raises(ConfigError, match=r"^data=.*: the file .* does not exist"):
        task_with_data(f"{LIT}:LitModel", str(tmp_path / "missing.py"))
    (tmp_path / "nodata.py").write_text(NO_DATA)
    with pytest.raises(ConfigError, match=r"name one with data='file.py:DataModule'") as err:
        load_task(str(tmp_path / "nodata.py"))
    assert "--" not in str(err.value)
    code, _, out = cli("profile", str(tmp_path / "nodata.py"), "--steps", "1", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 2
    assert "name one with --data 'file.py:DataModule'" in " ".join(out.split())


def test_data_on_a_module_that_makes_its_own_data_is_refused() -> None:
    """A plain nn.Module task trains on synthetic data: a datamodule given to it would be ignored."""
    module_file = str(HERE / "module_files.py")
    with pytest.raises(ConfigError, match=r"^data= applies to a LightningModule task, but the task .*ConvNet"):
        task_with_data(f"{module_file}:ConvNet", f"{LIT}:DigitsData")
    code, _, err = cli("batch-size", f"{module_file}:ConvNet", "--data", f"{LIT}:DigitsData", "--memory-budget", "1GiB")
    assert code == 2
    assert "--data applies to a LightningModule task" in " ".join(err.split())


def test_data_option_names_the_datamodule(tmp_path: Path) -> None:
    task = task_with_data(f"{LIT}:LitModel", f"{LIT}:DigitsData")
    assert isinstance(task, LightningTask)
    code, out, err = cli("profile", f"{LIT}:LitModel", "--data", f"{LIT}:DigitsData", "--steps", "2",
                         "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 0, err
    assert out["task"] == "LitModel"
    assert out["params"]["total"] == 64 * 64 + 64 + 64 * 10 + 10
    assert out["macs"] == 64 * (64 * 64 + 64 * 10)  # the datamodule's batch of 64


def test_batch_size_and_lr_find_by_file_name(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    code, out, err = cli("batch-size", LIT, "--memory-budget", "64MB", "--db", db)
    assert code == 0, err
    assert out["max_batch_size"] >= 64
    code, out, err = cli("lr-find", LIT, "--steps", "30", "--db", db)
    assert code == 0, err
    assert len(out["curve"]["lr"] if isinstance(out.get("curve"), dict) else out["curve"]) >= 5


def test_tune_and_compress_by_file_name(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: categorical, choices: [16, 32]}\n"
                     "  lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n")
    code, out, err = cli("tune", LIT, "--space", str(space), "--trials", "2", "--epochs", "1", "--db", db)
    assert code == 0, err
    assert len(out["trials"]) == 2
    assert out["best"]["metrics"]["accuracy"] > 0.5
    code, out, err = cli("compress", LIT, "--quantize", "dynamic", "--max-accuracy-drop", "0.05",
                         "--param", "hidden=32", "--db", db)
    assert code == 0, err
    assert out["metric"] == "accuracy"  # what validation_step logged
    assert out["baseline"]["metric"] > 0.5
    assert out["baseline"]["metrics"]["accuracy"] == out["baseline"]["metric"]
    dynamic = next(c for c in out["candidates"] if c["method"] == "dynamic")
    assert dynamic["metric_drop"] <= 0.05  # measured with the module's own validation_step
    # on a busy machine INT8 on a 2k-parameter MLP need not be faster: then the note says so
    assert out["selected"] is not None or any("not better on --goal latency" in n for n in out["notes"])


def test_test_dataloader_is_the_held_out_split(tmp_path: Path) -> None:
    """A datamodule's test_dataloader becomes Task.test_data (set up for "test", evaluated with
    validation_step so its metrics have the same names); without one, test_data is None."""
    import textwrap

    import torch

    from proftune.train import evaluate_model

    src = (HERE / "lit_digits.py").read_text()
    src = src.replace("        self.val_set = TensorDataset(x[1400:], y[1400:])\n",
                      "        self.val_set = TensorDataset(x[1400:1600], y[1400:1600])\n"
                      "        if stage in (None, 'test'):\n"
                      "            self.test_set = TensorDataset(x[1600:], y[1600:])\n")
    src += textwrap.dedent("""

        def _test_dataloader(self):
            return DataLoader(self.test_set, batch_size=self.hparams.batch_size)

        DigitsData.test_dataloader = _test_dataloader
    """)
    path = tmp_path / "lit_with_test.py"
    path.write_text(src)
    task = load_task(str(path))
    batches = list(task.test_data(32))
    assert sum(len(b[1]) for b in batches) == 1797 - 1600
    assert batches[0][0].shape == (32, 64)
    model = task.build_model({})
    test = evaluate_model(task, model, torch.device("cpu"), 32, split="test")
    assert set(test) >= {"accuracy", "val_loss"}
    assert load_task(LIT).test_data(32) is None


def test_a_task_with_data_pickles_as_its_specs_and_loads_in_another_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray trial (or a --workers process) gets a pickled copy and runs in a folder of its own:
    the copy is built again from the two files, named by absolute paths."""
    import pickle
    import shutil

    (tmp_path / "lit").mkdir()
    shutil.copy(LIT, tmp_path / "lit" / "lit_digits.py")
    monkeypatch.chdir(tmp_path)
    task = task_with_data("lit/lit_digits.py:LitModel", "lit/lit_digits.py:DigitsData")
    blob = pickle.dumps(task)
    elsewhere = tmp_path / "trial"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    copy = pickle.loads(blob)
    assert isinstance(copy, LightningTask)
    lit = tmp_path.resolve() / "lit" / "lit_digits.py"
    assert copy.specs == (f"{lit}:LitModel", f"{lit}:DigitsData")
    assert copy.default_params == task.default_params
    assert fit(copy, max_steps=2, device="cpu").steps == 2
