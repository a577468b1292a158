"""`proftune tune`: --json keys, and bad input exits 2 with one message listing every problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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
    for needle in ("low=0.1 > high=0.001", "log: true (a key of the space file) needs low > 0",
                   "type='activation' is unknown",
                   "choices is empty", "metric 'f1' is produced by nothing",
                   "metric 'latency_p99' is produced by nothing",
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
    assert "'hidden' is fixed to 8 by --param and also searched by the space" in result.stderr


def test_library_problems_read_as_the_flags_of_tune(tmp_path: Path) -> None:
    """search() names SearchConfig's fields (trials=0, objectives=, params=); tune prints its flags."""
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: categorical, choices: [8, 16]}\n")
    db = ["--db", f"sqlite:///{tmp_path / 'p.db'}"]
    result = runner.invoke(app, ["tune", "wine-mlp", "--space", str(space), "--objective", "x y",
                                 "--objective", "accuracy", "--objective", "val_loss", "--constraint", "f1>0.3",
                                 "--param", "hidden=8", "--pruner", "median", "--backend", "nope", "--scan", "-1",
                                 "--trials", "0", "--max-gated", "-1", "--workers", "0", "--max-failures", "-1",
                                 "--timeout", "0", "--epochs", "0", *db])
    assert result.exit_code == 2, result.output
    for needle in ("--objective 'x y' is malformed", "--constraint 'f1>0.3': metric 'f1' is produced by nothing",
                   "'hidden' is fixed to 8 by --param and", "--backend 'nope' is unknown", "--scan -1 must be",
                   "--pruner 'median' needs one objective (Optuna cannot prune multi-objective trials), but "
                   "--objective has 2", "--trials 0 must be >= 1", "--max-gated -1 must be >= 0",
                   "--workers 0 must be >= 1", "--max-failures -1 must be >= 0", "--timeout 0.0 must be > 0",
                   "--epochs 0 must be >= 1"):
        assert needle in result.stderr, (needle, result.stderr)
    for name in ("objectives=", "constraints=", "params=", "trials=", "max_failures=", "pruner="):
        assert name not in result.stderr, (name, result.stderr)
    for args, needle in ((["--backend", "ray", "--scheduler", "nope"], "--scheduler 'nope' is unknown"),
                         (["--backend", "ray", "--ray-address", "foo"], "--ray-address 'foo' is malformed"),
                         (["--sampler", "nope"], "--sampler 'nope' is unknown")):
        result = runner.invoke(app, ["tune", "wine-mlp", "--space", str(space), *args, *db])
        assert result.exit_code == 2, result.output
        assert needle in result.stderr, (needle, result.stderr)
    missing = tmp_path / "none.yaml"
    result = runner.invoke(app, ["tune", "wine-mlp", "--space", str(missing), *db])
    assert result.exit_code == 2, result.output
    assert f"--space {str(missing)!r} does not exist" in result.stderr
    assert not (tmp_path / "p.db").exists()  # nothing ran, nothing was written


def test_a_failed_study_and_a_changed_one_name_their_flags(tmp_path: Path) -> None:
    """The exit-1 failure (too many failed trials) and a study's other definition read in flags too."""
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  fault: {type: categorical, choices: [raise]}\n")
    faulty = f"{Path(__file__).parent / '_tasks.py'}:FaultyWine"
    db = ["--db", f"sqlite:///{tmp_path / 'p.db'}"]
    result = runner.invoke(app, ["tune", faulty, "--space", str(space), "--trials", "3", "--epochs", "1",
                                 "--max-failures", "0", "--study", "f", *db])
    assert result.exit_code == 1, result.output
    assert "1 trials failed (more than --max-failures 0)" in result.stderr, result.stderr
    space.write_text("params:\n  fault: {type: categorical, choices: [none, raise]}\n")
    result = runner.invoke(app, ["tune", faulty, "--space", str(space), "--study", "f", *db])
    assert result.exit_code == 2, result.output
    assert "Use another --study name, or the original space" in result.stderr, result.stderr


def test_a_trial_count_the_timeout_cannot_reach_is_said_with_the_pace(tmp_path: Path) -> None:
    """--trials far beyond what --timeout holds (issue 47): one line after the first trials, with
    the pace it came from; the search stops at the timeout."""
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: int, low: 4, high: 32}\n")
    result = runner.invoke(app, ["tune", "wine-mlp", "--space", str(space), "--trials", "1000000000", "--epochs", "1",
                                 "--timeout", "8", "--db", f"sqlite:///{tmp_path / 'p.db'}"])
    assert result.exit_code == 0, result.output
    assert "--trials 1000000000: at ~" in result.stderr
    assert "s a trial (the median of the first 3)" in result.stderr
    assert "the --timeout 8 s holds ~" in result.stderr
    assert result.stderr.count("--trials 1000000000") == 1  # said once


def test_a_trial_count_that_would_take_days_without_a_timeout_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from proftune.cli import _tune

    buf = io.StringIO()
    monkeypatch.setattr(_tune, "err_console", Console(file=buf, width=400))
    seen: list[object] = []
    pace = _tune.TrialPace(10**9, timeout=None, workers=2, then=seen.append)
    for _ in range(4):
        pace(SimpleNamespace(duration_s=0.5))
    assert len(seen) == 4  # every trial still reaches the live logger
    text = buf.getvalue()
    assert "the 999999997 left would take ~" in text
    assert "days; --timeout S bounds it" in text
    assert text.count("--trials") == 1
