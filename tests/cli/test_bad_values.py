"""Values from user code that are not what they should be (issue 62): a metric that is not one
number is refused where it enters, naming the metric and the value; NaN and infinity are recorded
and every later step reads them; a value so large that the importance analysis overflows leaves
the study's result standing; a param that cannot be stored is refused before any training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app

TASK = '''
import torch
import proftune

VALUE = {value}


class Bad(proftune.Task):
    name = "bad"
    default_params = {{"lr": 1e-2, "batch_size": 16{extra}}}
    default_epochs = 1

    def build_model(self, params):
        return torch.nn.Linear(4, 2)

    def train_data(self, batch_size, params):
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(16, 4, generator=g), torch.randint(0, 2, (16,), generator=g)) for _ in range(2)]

    def val_data(self, batch_size):
        return self.train_data(batch_size, {{}})

    def loss(self, model, batch):
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    def evaluate(self, model, data):
        return {{"accuracy": VALUE}}
'''


def _task(tmp_path: Path, value: str, extra: str = "") -> str:
    path = tmp_path / "bad.py"
    path.write_text(TASK.format(value=value, extra=extra))
    return str(path)


def _invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.output


@pytest.mark.parametrize("value", ["float('inf')", "float('nan')"])
def test_a_non_finite_metric_is_recorded_and_shown(tmp_path: Path, value: str) -> None:
    code, out = _invoke("train", _task(tmp_path, value), "--device", "cpu", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 0, out
    assert "not finite" in out
    assert "Traceback" not in out


@pytest.mark.parametrize(("value", "shown"), [("[0.9]", "accuracy=[0.9]"), ("'high'", "accuracy='high'")])
def test_a_metric_that_is_not_one_number_is_refused_naming_it(tmp_path: Path, value: str, shown: str) -> None:
    code, out = _invoke("train", _task(tmp_path, value), "--device", "cpu", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 2, out
    assert "evaluate() returned values that are not metrics" in out
    assert shown in out
    assert "Traceback" not in out


def test_a_huge_metric_leaves_the_tune_result_standing(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  lr: {type: float, low: 0.001, high: 0.1, log: true}\n")
    code, out = _invoke("tune", _task(tmp_path, "1e308"), "--space", str(space), "--trials", "3",
                        "--objective", "accuracy:max", "--device", "cpu", "--json",
                        "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 0, out  # before: an empty AssertionError from the importance analysis, exit 1
    result = json.loads(out.split("\n", 1)[0])
    fanova = result["importance"]["accuracy"]["fanova"]
    assert "1e+308" in fanova["error"]  # what overflowed, recorded with the study's result
    assert result["best"]["metrics"]["accuracy"] == 1e308


def test_a_param_that_cannot_be_stored_is_refused_before_any_work(tmp_path: Path) -> None:
    out_dir = tmp_path / "o"
    code, out = _invoke("optimize", _task(tmp_path, "0.5", extra=', "act": lambda x: x'), "--budget", "1m",
                        "--out", str(out_dir), "--device", "cpu", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    assert code == 2, out
    assert "param act=" in out
    assert "cannot be stored" in out
    assert not (out_dir / "state.json").exists()
