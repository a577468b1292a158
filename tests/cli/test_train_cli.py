"""`proftune train` and `proftune runs` end to end: through the console script where the process
is what a test checks (its exit code and streams as a shell sees them, the working folder), in
process (the same ``app``, the same exit codes) where it is not, for time: each process start
imports torch and the package, 3 s of CPU, 10-20 s on a loaded 2-core machine."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proftune.cli", *args], capture_output=True, text=True, cwd=cwd,
        timeout=300, env={**os.environ, **(env or {})},
    )


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    """``proftune ARGS`` in this process, read back like :func:`run_cli`'s process."""
    from typer.testing import CliRunner

    from proftune.cli import app

    res = CliRunner().invoke(app, list(args))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, res.stderr)


def test_train_json_and_show(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    out = run_cli("train", "digits-cnn", "--epochs", "10", "--json", "--db", db, "--device", "cpu")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)  # stdout holds exactly one JSON object
    assert result["metrics"]["accuracy"] >= 0.95
    shown = invoke("runs", "show", str(result["run_id"]), "--json", "--db", db)
    assert shown.returncode == 0, shown.stderr
    run = json.loads(shown.stdout)
    for key in ("env", "data_fingerprint", "config", "metrics", "curves"):
        assert run[key], key
    assert len(run["data_fingerprint"]) == 8
    assert len(run["curves"]["epoch"]) == 10
    assert run["status"] == "finished"
    listed = json.loads(invoke("runs", "list", "--json", "--db", db, "--kind", "train").stdout)
    assert [r["run_id"] for r in listed["runs"]] == [result["run_id"]]


def test_compare_two_runs(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    ids = []
    for lr in ("0.001", "0.01"):
        out = invoke("train", "wine-mlp", "--epochs", "2", "--param", f"lr={lr}", "--json", "--db", db)
        ids.append(json.loads(out.stdout)["run_id"])
    diff = json.loads(invoke("runs", "compare", str(ids[0]), str(ids[1]), "--json", "--db", db).stdout)
    assert diff["config"]["params.lr"] if "params.lr" in diff["config"] else diff["config"]["params"]
    assert diff["data_fingerprint"]["match"] is True
    assert "accuracy" in diff["metrics"]


def test_default_db_in_working_dir(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PROFTUNE_DB"}
    out = subprocess.run([sys.executable, "-m", "proftune.cli", "train", "wine-mlp", "--epochs", "1", "--json"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "proftune.db").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("train", "no/such/task.py"), "does not exist"),
        (("train", "wine-mlp", "--param", "lr=abc"), "lr='abc'"),
        (("train", "wine-mlp", "--epochs", "0"), "--epochs"),
        (("train", "wine-mlp", "--param", "lr"), "not key=value"),
        (("runs", "list", "--kind", "nonsense"), "nonsense"),
    ],
)
def test_bad_input_exits_2(args: tuple[str, ...], needle: str) -> None:
    # the first through the console script, as a shell sees it; the rest in process
    out = run_cli(*args) if args == ("train", "no/such/task.py") else invoke(*args)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert needle in out.stderr
    assert out.stdout == ""


def test_file_without_task_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "nothing.py"
    f.write_text("x = 1\n")
    out = invoke("train", str(f))
    assert out.returncode == 2
    assert "no subclass of proftune.Task" in out.stderr


def test_db_not_a_database_exits_2_untouched(tmp_path: Path) -> None:
    f = tmp_path / "data.csv"
    f.write_text("a,b\n1,2\n")
    before = hashlib.md5(f.read_bytes()).hexdigest()
    out = invoke("train", "wine-mlp", "--epochs", "1", "--db", f"sqlite:///{f}")
    assert out.returncode == 2
    assert "not a SQLite database" in out.stderr
    assert hashlib.md5(f.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.csv"]


def test_failure_while_running_exits_1(tmp_path: Path) -> None:
    f = tmp_path / "crash.py"
    f.write_text(
        "import proftune\n"
        "class Crash(proftune.Task):\n"
        "    def build_model(self, params):\n"
        "        raise RuntimeError('model factory exploded')\n"
        "    def train_data(self, batch_size, params):\n"
        "        return []\n"
    )
    db = f"sqlite:///{tmp_path / 'p.db'}"
    out = run_cli("train", str(f), "--db", db, "--json")
    assert out.returncode == 1
    assert "model factory exploded" in out.stderr
    assert "Traceback" not in out.stderr
    runs = json.loads(invoke("runs", "list", "--json", "--db", db).stdout)["runs"]
    assert runs[0]["status"] == "failed"


def test_tasks_lists_builtins() -> None:
    out = invoke("tasks", "--json")
    names = {t["name"] for t in json.loads(out.stdout)["tasks"]}
    assert {"digits-mlp", "digits-cnn", "digits-transformer", "wine-mlp", "resnet18-synthetic"} <= names


def test_a_scheduler_counted_in_epochs_but_stepped_per_step_is_one_warning_on_stderr(tmp_path: Path) -> None:
    """The CLI hides library warnings; a warning about the user's own task still shows, once."""
    from proftune import _schedule

    _schedule._WARNED.clear()
    task = tmp_path / "sched.py"
    task.write_text(
        "import torch\nimport proftune\n\n\n"
        "class Sched(proftune.ClassificationTask):\n"
        "    name = 'sched'\n"
        "    default_params = {'lr': 0.1, 'batch_size': 8}\n"
        "    default_epochs = 4\n\n"
        "    def build_model(self, params):\n        return torch.nn.Linear(3, 2)\n\n"
        "    def train_data(self, batch_size, params):\n"
        "        g = torch.Generator().manual_seed(0)\n"
        "        return [(torch.randn(8, 3, generator=g), torch.randint(0, 2, (8,), generator=g))\n"
        "                for _ in range(8)]\n\n"
        "    def val_data(self, batch_size):\n        return self.train_data(batch_size, {})\n\n"
        "    def configure_scheduler(self, optimizer, params, *, epochs, max_steps):\n"
        "        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)\n")
    out = invoke("train", str(task), "--json", "--db", f"sqlite:///{tmp_path / 'p.db'}", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("warning:") == 1, out.stderr
    assert "StepLR(step_size=2)" in out.stderr
    assert json.loads(out.stdout)["run_id"]
