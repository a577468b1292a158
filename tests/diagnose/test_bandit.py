from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from proftune import Task
from proftune.cli import app
from proftune.diagnose import Arm, Bandit, simulate
from proftune.diagnose import bandit as run_bandit
from proftune.examples import TensorBatches
from proftune.exceptions import ConfigError
from proftune.track import Store

MEANS = [0.90, 0.88, 0.85, 0.80, 0.70]


@pytest.mark.parametrize("policy", ["thompson", "ucb"])
def test_bandit_converges_on_the_best_of_five(policy: str) -> None:
    for seed in range(3):
        sim = simulate(MEANS, rounds=200, policy=policy, noise=0.03, seed=seed)
        uniform = simulate(MEANS, rounds=200, policy="uniform", noise=0.03, seed=seed)
        assert sim.best_share_last_half >= 0.8
        assert sim.regret[-1] < 0.2 * uniform.regret[-1]
        assert all(b >= a for a, b in zip(sim.regret, sim.regret[1:], strict=False))


def test_state_carries_across_store_sessions(db_url: str) -> None:
    arms = [Arm("a", {"lr": 0.1}), Arm("b", {"lr": 0.01})]
    first = Bandit(arms, name="ab", store=Store(db_url))
    first.update("a", 0.9)
    first.update("b", 0.5)
    second = Bandit(arms, name="ab", store=Store(db_url))
    assert second.t == 2
    assert second.stats["a"].mean == 0.9
    assert second.best() == "a"
    other = Bandit(arms, name="other", store=Store(db_url))
    assert other.t == 0


def test_bandit_validates() -> None:
    with pytest.raises(ConfigError) as info:
        Bandit([Arm("a")], policy="greedy")
    assert "policy='greedy'" in str(info.value)
    assert "at least 2" in str(info.value)
    with pytest.raises(ConfigError, match="rounds"):
        simulate(MEANS, rounds=0)


def _configs(tmp_path: Path, text: str) -> str:
    path = tmp_path / "configs.yaml"
    path.write_text(text)
    return str(path)


GOOD = """
- name: tuned
  lr: 0.01
- name: tiny
  lr: 0.00001
"""


def test_cli_bandit_runs_records_and_continues(tmp_path: Path, db_url: str) -> None:
    configs = _configs(tmp_path, GOOD)
    runner = CliRunner()
    args = ["bandit", "digits-mlp", "--configs", configs, "--rounds", "2", "--epochs", "1", "--db", db_url, "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    d = json.loads(first.stdout)
    assert d["total_pulls"] == 2
    assert d["metric"] == "accuracy"
    assert len(d["regret"]) == 2
    assert {p["arm"] for p in d["pulls"]} == {"tuned", "tiny"}
    # a second process continues the same bandit
    proc = subprocess.run([sys.executable, "-m", "proftune.cli", *args[:4], "--rounds", "1", *args[6:]],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    d2 = json.loads(proc.stdout)
    assert d2["total_pulls"] == 3
    assert d2["bandit"] == d["bandit"]
    assert d2["best"] == "tuned"
    store = Store(db_url)
    kinds = [r.kind for r in store.list_runs()]
    assert kinds.count("bandit") == 2
    assert kinds.count("train") == 3
    assert all(r.parent_id is not None for r in store.list_runs(kind="train"))


def test_cli_bandit_bad_input_exits_2(tmp_path: Path, db_url: str) -> None:
    runner = CliRunner()
    bad = _configs(tmp_path, "- {lr: 0.01}\n- {lr: 0.1, widht: 32}\n")
    res = runner.invoke(app, ["bandit", "digits-mlp", "--configs", bad, "--rounds", "2", "--db", db_url])
    assert res.exit_code == 2
    assert "'widht' is unknown" in res.output
    assert "hidden" in res.output
    res = runner.invoke(app, ["bandit", "digits-mlp", "--configs", _configs(tmp_path, GOOD), "--rounds", "0",
                              "--db", db_url])
    assert res.exit_code == 2
    assert "rounds" in res.output.lower()
    res = runner.invoke(app, ["bandit", "digits-mlp", "--configs", str(tmp_path / "none.yaml"), "--rounds", "1",
                              "--db", db_url])
    assert res.exit_code == 2
    assert "does not exist" in res.output
    assert "--configs '" in res.output
    assert "configs=" not in res.output


def test_library_errors_name_python_arguments(tmp_path: Path) -> None:
    import proftune
    from proftune.diagnose import load_configs

    with pytest.raises(ConfigError, match=r"^configs='[^']*none\.yaml' does not exist"):
        load_configs(tmp_path / "none.yaml", proftune.load_task("digits-mlp"))


class _Regression(Task):
    """y = 3x + noise; reports ``mse`` (lower is better) and ``r2``; a tiny ``lr`` barely learns."""

    name = "regression"
    default_epochs = 1

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(256, 1, generator=g)
        self.y = 3 * self.x + 0.1 * torch.randn(256, 1, generator=g)

    def build_model(self, params: dict[str, Any]) -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Linear(1, 1)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Any:
        return TensorBatches(self.x, self.y, batch_size, shuffle=False)

    def val_data(self, batch_size: int) -> Any:
        return TensorBatches(self.x, self.y, batch_size, shuffle=False)

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    def evaluate(self, model: torch.nn.Module, data: Any) -> dict[str, float]:
        with torch.no_grad():
            mse = float(torch.nn.functional.mse_loss(model(self.x), self.y))
        return {"mse": mse, "r2": 1 - mse / float(self.y.var())}

    def configure_optimizer(self, model: torch.nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=params["lr"])


def test_bandit_minimises_mse(db_url: str) -> None:
    """Bug 6: the bandit maximised ``mse`` (the direction was guessed from "loss" in the name)."""
    arms = [Arm("frozen", {"lr": 1e-6}), Arm("learns", {"lr": 0.1})]
    report = run_bandit(_Regression(), arms, rounds=4, metric="mse", epochs=1, store=Store(db_url), seed=0)
    assert report.mode == "min"
    means = {a.arm: a.mean for a in report.arms}
    assert means["learns"] < means["frozen"]
    assert report.best == "learns"
    maximise = run_bandit(_Regression(), arms, rounds=2, metric="r2", epochs=1, store=Store(db_url), seed=0)
    assert maximise.mode == "max"
    assert maximise.best == "learns"


def test_bandit_metric_of_unknown_direction_exits_before_training(db_url: str) -> None:
    arms = [Arm("a", {"lr": 1e-6}), Arm("b", {"lr": 0.1})]
    store = Store(db_url)
    with pytest.raises(ConfigError, match="metric_directions"):
        run_bandit(_Regression(), arms, rounds=1, metric="wobble", store=store)
    assert store.list_runs() == []
