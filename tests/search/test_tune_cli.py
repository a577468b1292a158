"""`proftune tune`: --json keys, and bad input exits 2 with one message listing every problem."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from proftune.cli import app

runner = CliRunner()


def test_json_output_has_the_contract_keys(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: categorical, choices: [8, 64]}\n"
                     "  lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n")
    result = runner.invoke(app, ["tune", "wine-mlp", "--space", str(space), "--trials", "3",
                                 "--epochs", "1", "--constraint", "params<2000", "--sampler", "random",
                                 "--study", "cli", "--db", f"sqlite:///{tmp_path / 'p.db'}",
                                 "--plot", str(tmp_path / "plots"), "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert list(d)[:8] == ["study", "best", "trials", "correlations", "importance", "budget", "scan", "strategy"]
    assert d["study"] == "cli"
    assert len(d["trials"]) == 3
    assert d["budget"]["trained"] == 3
    # the scan (on by default with a hard profile constraint) kept only the width that fits
    assert [b["param"] for b in d["scan"]["bounds"]] == ["hidden"]
    assert d["budget"]["gated"] == 0
    assert all(t["params"]["hidden"] == 8 for t in d["trials"])
    assert {st["subject"] for st in d["strategy"]} >= {"hidden", "lr", "params<2000"}
    for t in d["trials"]:
        assert {"number", "state", "params", "metrics", "constraints", "reason", "duration_s"} <= set(t)
        assert t["state"] in ("complete", "pruned", "infeasible", "failed", "running")
    assert (tmp_path / "plots" / "history.png").stat().st_size > 1000


def test_bad_input_exits_2_listing_every_problem(tmp_path: Path) -> None:
    space = tmp_path / "bad.yaml"
    space.write_text(
        "params:\n"
        "  lr: {type: float, low: 0.1, high: 0.001}\n"
        "  wd: {type: float, low: 0.0, high: 0.1, log: true}\n"
        "  act: {type: activation, choices: [relu]}\n"
        "  hidden: {type: categorical, choices: []}\n")
    result = runner.invoke(app, ["tune", "wine-mlp", "--space", str(space),
                                 "--objective", "f1:max", "--constraint", "latency_p99<3",
                                 "--constraint", "step_time_ms<<50",
                                 "--db", f"sqlite:///{tmp_path / 'p.db'}", "--json"])
    assert result.exit_code == 2
    assert result.stdout == ""
    err = result.stderr
    for needle in ("low=0.1 > high=0.001", "log=true needs low > 0", "type='activation' is unknown",
                   "choices is empty", "metric 'f1' is produced by nothing", "metric 'latency_p99' is produced by nothing",
                   "'step_time_ms<<50' is malformed"):
        assert needle in err, (needle, err)
    assert not (tmp_path / "p.db").exists()  # nothing ran, nothing was written


def test_param_fixes_a_param_for_every_trial(tmp_path: Path) -> None:
    import proftune

    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: categorical, choices: [8, 16]}\n")
    result = runner.invoke(app, ["tune", "wine-mlp", "--space", str(space), "--trials", "2", "--epochs", "2",
                                 "--sampler", "grid", "--param", "optimizer=sgd", "-p", "lr=0.05",
                                 "--study", "fixed", "--db", f"sqlite:///{tmp_path / 'p.db'}", "--json"])
    assert result.exit_code == 0, result.output
    trials = json.loads(result.stdout)["trials"]
    assert sorted(t["params"]["hidden"] for t in trials) == [8, 16]
    for t in trials:  # each trial trained with SGD at 0.05: the same run as fit with those params
        assert t["params"]["optimizer"] == "sgd"
        assert t["params"]["lr"] == 0.05
        sgd = proftune.fit("wine-mlp", {"hidden": t["params"]["hidden"], "optimizer": "sgd", "lr": 0.05},
                           epochs=2, device="cpu")
        assert t["metrics"]["val_loss"] == sgd.metrics["val_loss"]
    default = proftune.fit("wine-mlp", {"hidden": 8}, epochs=2, device="cpu")  # AdamW at the task's lr
    assert trials[0]["metrics"]["val_loss"] != default.metrics["val_loss"]


def test_param_on_a_searched_param_exits_2_naming_it(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: categorical, choices: [8, 16]}\n")
    result = runner.invoke(app, ["tune", "wine-mlp", "--space", str(space), "--param", "hidden=8",
                                 "--db", f"sqlite:///{tmp_path / 'p.db'}"])
    assert result.exit_code == 2, result.output
    assert "'hidden' is both fixed (params, --param hidden=8) and searched by the space" in result.stderr
