"""A failure in the user's own code (a task's evaluate() raising, ragged batches in its data) names
the task's method and its file:line in the one-line message, without --debug."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from proftune.cli import app

TASKS = '''
import torch
from torch.utils.data import DataLoader

import proftune


def _rows(n, ragged=False):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(5 if ragged and i % 3 == 0 else 4, generator=g), torch.tensor(i % 2)) for i in range(n)]


class Base(proftune.Task):
    def build_model(self, params):
        return torch.nn.Linear(4, 2)

    def train_data(self, batch_size, params):
        return DataLoader(_rows(32), batch_size=8)

    def val_data(self, batch_size):
        return DataLoader(_rows(16), batch_size=8)

    def loss(self, model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)


def _score(model, data):
    raise ValueError("my metric broke")  # the line to fix


class BadEval(Base):
    def evaluate(self, model, data):
        return {"accuracy": _score(model, data)}  # called from here


class Ragged(Base):
    def train_data(self, batch_size, params):  # ragged rows, which default_collate cannot stack
        return DataLoader(_rows(32, ragged=True), batch_size=8)
'''


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _task_file(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.py"
    path.write_text(TASKS)
    return path


def test_evaluate_raising_names_the_line_and_the_task_method(tmp_path: Path) -> None:
    path = _task_file(tmp_path)
    res = CliRunner().invoke(app, ["train", f"{path}:BadEval", "--max-steps", "2", "--device", "cpu"])
    assert res.exit_code == 1, res.output
    assert "ValueError: my metric broke" in res.output
    assert f"in _score ({path}:{_line(path, 'the line to fix')})" in res.output, res.output
    assert f"called from BadEval.evaluate ({path}:{_line(path, 'called from here')})" in res.output, res.output
    assert "Traceback" not in res.output


def test_ragged_batches_name_the_data_method(tmp_path: Path) -> None:
    path = _task_file(tmp_path)
    res = CliRunner().invoke(app, ["train", f"{path}:Ragged", "--max-steps", "2", "--device", "cpu"])
    assert res.exit_code == 1, res.output
    assert "stack expects each tensor to be equal size" in res.output
    assert f"in the data of Ragged.train_data ({path}:{_line(path, 'ragged rows')})" in res.output, res.output


def test_a_tune_whose_trials_raise_names_the_line(tmp_path: Path) -> None:
    path = _task_file(tmp_path)
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  lr: {type: float, low: 0.0001, high: 0.1, log: true}\n")
    res = CliRunner().invoke(app, ["tune", f"{path}:BadEval", "--space", str(space), "--trials", "1", "--epochs", "1",
                                   "--objective", "accuracy:max", "--device", "cpu"])
    assert res.exit_code == 1, res.output
    assert f"in _score ({path}:{_line(path, 'the line to fix')})" in res.output, res.output
