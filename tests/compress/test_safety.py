"""Loading never runs code from a file unless the user trusts it; bad files exit 2 saying what
the file should be; models handed to a task's evaluate() behave like modules; no warning noise."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import proftune
from proftune.cli import app
from proftune.compress import ExportedModule, load_model
from proftune.exceptions import ConfigError
from proftune.track import Store

runner = CliRunner()
FAST = {"latency_rounds": 1, "finetune_epochs": 0, "layer_times": False}


class _WritesMarker:
    """Unpickling this writes a file: what a malicious checkpoint does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def _malicious_checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    """A real digits-mlp module whose pickle also runs code; returns (checkpoint, marker)."""
    marker = tmp_path / "marker.txt"
    model = proftune.load_task("digits-mlp").build_model({})
    model.payload = _WritesMarker(marker)  # type: ignore[assignment]
    path = tmp_path / "evil.pt"
    torch.save(model, path)
    assert not marker.exists()
    return path, marker


def test_malicious_pickle_exits_2_and_runs_nothing(tmp_path: Path) -> None:
    path, marker = _malicious_checkpoint(tmp_path)
    res = runner.invoke(app, ["compress", "digits-mlp", "--model", str(path), "--prune", "unstructured",
                              "--db", f"sqlite:///{tmp_path / 'c.db'}"])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())  # rich wraps long lines
    assert f"--model {str(path)!r} holds a whole pickled model" in out
    assert "(--trust-model)" in out
    assert "trust_model=" not in out
    assert "runs code" in res.output
    assert "state_dict()" in out  # what proftune accepts instead
    for advice in ("weights_only", "will likely succeed", "add_safe_globals", "allowlist"):
        assert advice not in out  # torch's own advice is the code-running load, not ours
    assert not marker.exists()
    with pytest.raises(ConfigError, match=r"\(trust=True\)") as err:
        load_model(path)
    assert f"path={str(path)!r} holds" in str(err.value)
    assert "--" not in str(err.value)
    with pytest.raises(ConfigError, match=r"\(trust_model=True\)") as err:  # compress() names its own argument
        proftune.compress("digits-mlp", model=str(path), prune="unstructured", db=f"sqlite:///{tmp_path / 'l.db'}")
    assert f"model={str(path)!r} holds" in str(err.value)
    assert not marker.exists()


def test_trusted_pickle_loads(tmp_path: Path, db_url: str) -> None:
    path, marker = _malicious_checkpoint(tmp_path)
    report = proftune.compress("digits-mlp", model=str(path), trust_model=True, prune="unstructured",
                               ratios=(0.5,), max_accuracy_drop=1.0, db=db_url, **FAST)
    assert marker.exists()  # the user said they trust it: its code ran, and the model loaded
    original = proftune.load_task("digits-mlp").build_model({})
    assert report.baseline.params == sum(p.numel() for p in original.parameters())
    assert isinstance(load_model(path, trust=True), nn.Module)


HELPER_TASK = '''
import pathlib
pathlib.Path(__file__).with_name("imported.txt").write_text("helper.py ran")
import proftune
from torch import nn


class Helper(proftune.ClassificationTask):
    def build_model(self, params):
        return nn.Linear(4, 2)

    def train_data(self, batch_size, params):
        return []

    def val_data(self, batch_size):
        return []
'''


def test_a_checkpoint_naming_a_task_file_runs_it_only_when_the_caller_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "dl"
    folder.mkdir()
    (folder / "helper.py").write_text(HELPER_TASK)
    spec = f"{folder / 'helper.py'}:Helper"
    crafted = tmp_path / "crafted.pt"  # plain values only: loads with weights_only=True
    torch.save({"kind": "proftune.compress/state", "task": spec, "params": {}, "attrs": {},
                "state_dict": nn.Linear(4, 2).state_dict()}, crafted)
    with pytest.raises(ConfigError, match="trust=True") as err:
        load_model(crafted)
    assert "task=" in str(err.value)
    assert not (folder / "imported.txt").exists()  # the file's choice of code did not run
    assert isinstance(load_model(crafted, task=spec), nn.Linear)  # the caller named it
    assert (folder / "imported.txt").exists()
    (folder / "imported.txt").unlink()
    assert isinstance(load_model(crafted, trust=True), nn.Linear)


USER_TASK = '''
import torch
from torch import nn
import proftune
from proftune.examples import TensorBatches


class Mine(proftune.ClassificationTask):
    def build_model(self, params):
        return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))

    def train_data(self, batch_size, params):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=g)
        return TensorBatches(x, (x[:, 0] > 0).long(), batch_size, shuffle=False)

    def val_data(self, batch_size):
        return self.train_data(batch_size, {})
'''


def test_a_user_tasks_load_line_names_the_task(tmp_path: Path, db_url: str) -> None:
    (tmp_path / "mine.py").write_text(USER_TASK)
    spec = f"{tmp_path / 'mine.py'}:Mine"
    out = tmp_path / "small.pt"
    # structured: a smaller file (unstructured pruning keeps the dense size, and a candidate no
    # smaller than the original is not a result on --goal size)
    report = proftune.compress(spec, prune="structured", ratios=(0.5,), sensitivity=False,
                               max_accuracy_drop=1.0, goal="size", out=str(out), baseline_epochs=1, db=db_url,
                               **FAST)
    assert report.selected is not None
    assert report.load_line is not None
    assert report.selected.format == "state"
    assert f"task={spec!r}" in report.load_line
    namespace: dict[str, object] = {}
    exec(report.load_line, namespace)  # the printed line works as it is
    assert isinstance(namespace["model"], nn.Module)


def test_files_that_are_not_checkpoints_exit_2(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    junk = tmp_path / "random.bin"
    junk.write_bytes(os.urandom(256))
    pickled = tmp_path / "plain.pkl"  # a plain pickle (protocol 4), not torch.save's: torch's unpickler refuses it
    pickled.write_bytes(pickle.dumps({"weights": [1.0, 2.0]}, protocol=4))
    for bad in ("/etc/passwd", str(junk), str(pickled)):
        res = runner.invoke(app, ["compress", "digits-mlp", "--model", bad, "--prune", "unstructured",
                                  "--db", db])
        assert res.exit_code == 2, res.output
        assert "is not a PyTorch checkpoint" in res.output
        assert "state_dict" in res.output
        # torch's advice to load with weights_only=False (code-running) is not passed on (issue 47)
        assert "weights_only" not in res.output
        assert "will likely succeed" not in res.output
    # a refused file is refused before any work: no compress Run is left behind, failed or not
    assert Store(db).list_runs() == []


def test_saved_selection_loads_safely_and_rebuilds_through_the_task(tmp_path: Path, db_url: str) -> None:
    out = tmp_path / "small.pt"
    report = proftune.compress("digits-mlp", prune="structured", ratios=(0.5,), max_accuracy_drop=1.0,
                               goal="macs", out=str(out), baseline_epochs=1, db=db_url, **FAST)
    assert report.selected is not None
    assert report.selected.format == "state"
    saved = torch.load(out, weights_only=True)  # plain values only: no code in the file
    assert saved["task"] == "digits-mlp"
    assert "load_model(" in (report.load_line or "")
    model = load_model(out)
    assert sum(p.numel() for p in model.parameters()) == report.selected.params
    assert not model.training


EVAL_TASK = '''
import torch
from proftune.examples._digits import DigitsMLP


class EvalFirst(DigitsMLP):
    name = "eval-first"

    def evaluate(self, model, data):
        model.eval()
        model.train()
        model.to("cpu")
        model.eval()
        with torch.no_grad():
            return super().evaluate(model, data)


class DictBatches(EvalFirst):
    """Batches are dicts; the model takes keyword arguments."""

    name = "dict-batches"

    def build_model(self, params):
        inner = super().build_model(params)

        class KW(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = inner

            def forward(self, pixels):
                return self.net(pixels)

        return KW()

    def train_data(self, batch_size, params):
        return [{"pixels": x, "label": y} for x, y in super().train_data(batch_size, params)]

    def val_data(self, batch_size):
        return [{"pixels": x, "label": y} for x, y in super().val_data(batch_size)]

    def loss(self, model, batch):
        return torch.nn.functional.cross_entropy(model(pixels=batch["pixels"]), batch["label"])

    def evaluate(self, model, data):
        model.eval()
        with torch.no_grad():
            correct = total = 0
            for b in data:
                correct += int((model(pixels=b["pixels"]).argmax(1) == b["label"]).sum())
                total += len(b["label"])
        return {"accuracy": correct / total}
'''


@pytest.mark.parametrize("task_class", ["EvalFirst", "DictBatches"])
def test_every_candidate_supports_eval_train_to(task_class: str, tmp_path: Path, db_url: str) -> None:
    task_file = tmp_path / "eval_task.py"
    task_file.write_text(EVAL_TASK)
    report = proftune.compress(f"{task_file}:{task_class}", quantize="dynamic", max_accuracy_drop=1.0,
                               baseline_epochs=1, db=db_url, **FAST)
    backends = {c.quant_backend for c in report.candidates}
    assert backends
    assert all(c.metric > 0.5 for c in [report.baseline, *report.candidates])
    assert set(report.candidates[0].backend_ms) == {"torch.ao", "torchao"}


def test_exported_module_switches() -> None:
    model = nn.Sequential(nn.Linear(4, 3)).eval()
    x = torch.randn(2, 4)
    program = torch.export.export(model, (x,)).module()
    wrapped = ExportedModule(program)
    assert wrapped.eval() is wrapped
    assert not wrapped.training
    assert wrapped.train().training
    with torch.no_grad():
        assert torch.equal(wrapped.to("cpu").eval()(x), model(x))


@pytest.mark.slow
def test_compress_stderr_has_no_library_warnings(tmp_path: Path) -> None:
    task_file = tmp_path / "eval_task.py"
    task_file.write_text(EVAL_TASK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run(
        [sys.executable, "-m", "proftune.cli", "compress", f"{task_file}:EvalFirst", "--quantize", "dynamic",
         "--max-accuracy-drop", "1", "--finetune-epochs", "0", "--device", "cpu",
         "--db", f"sqlite:///{tmp_path / 'c.db'}"],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )
    assert res.returncode == 0, res.stderr
    noisy = [line for line in res.stderr.splitlines() if "Warning" in line or "deprecated" in line]
    assert not noisy, noisy
