"""`proftune recommend`, `batch-size`, `lr-find`: JSON output, recorded runs, exit code 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from proftune.cli import app
from proftune.profile import MemoryProfile, Profile, StepProfile
from proftune.recommend import RECOMMENDATION_NAMES
from proftune.track import Store

runner = CliRunner()


def test_lr_find_min_not_below_max_exits_2(db_url: str) -> None:
    out = runner.invoke(app, ["lr-find", "digits-mlp", "--min-lr", "1", "--max-lr", "0.1", "--db", db_url])
    assert out.exit_code == 2
    assert "--min-lr 1.0 must be below --max-lr 0.1" in out.output  # the CLI names its flags


def test_batch_size_budget_below_the_model_exits_2_with_the_batch_1_need(db_url: str) -> None:
    out = runner.invoke(app, ["batch-size", "digits-mlp", "--memory-budget", "1000", "--device", "cpu",
                              "--db", db_url])
    assert out.exit_code == 2
    assert "before any activation" in out.output
    assert "batch size 1 peaks at" in out.output
    bad = runner.invoke(app, ["batch-size", "digits-mlp", "--memory-budget", "4 parsecs", "--db", db_url])
    assert bad.exit_code == 2
    assert "--memory-budget '4 parsecs'" in bad.output


def test_lr_find_json_plot_and_run(tmp_path: Path, db_url: str) -> None:
    plot = tmp_path / "lr.png"
    out = runner.invoke(app, ["lr-find", "digits-mlp", "--min-lr", "1e-4", "--max-lr", "10", "--steps", "20",
                              "--plot", str(plot), "--device", "cpu", "--json", "--db", db_url])
    assert out.exit_code == 0, out.output
    d = json.loads(out.stdout)
    assert {"suggested_lr", "min_lr", "max_lr", "curve", "run_id"} <= set(d)
    assert len(d["curve"]) == d["steps"] <= 20
    assert plot.exists()
    run = Store(db_url).get_run(d["run_id"])
    assert run.kind == "lr_find"
    assert run.status == "finished"
    assert len(run.curves["lr_range"]) == d["steps"]


def test_recommend_json_from_a_saved_profile(tmp_path: Path, db_url: str) -> None:
    profile = Profile(task="digits-mlp", device="cpu", batch_size=64, mode="train", steps=3,
                      memory=MemoryProfile(params_bytes=104_488, grads_bytes=104_488, optimizer_bytes=208_976,
                                           peak_bytes=900_000),
                      step=StepProfile(time_ms=4.0, data_ms=1.0, forward_ms=1.0, backward_ms=1.5,
                                       optimizer_ms=0.5, throughput=16_000.0))
    path = profile.save(tmp_path / "p.json")
    out = runner.invoke(app, ["recommend", "digits-mlp", "--profile", str(path), "--device", "cpu",
                              "--lr-steps", "15", "--noise-steps", "4", "--json", "--db", db_url])
    assert out.exit_code == 0, out.output
    d = json.loads(out.stdout)
    assert [r["name"] for r in d["recommendations"]] == list(RECOMMENDATION_NAMES)
    by = {r["name"]: r for r in d["recommendations"]}
    # no budget on CPU: no memory search, and it says so; 25% of the step waits for data
    assert "no memory budget" in by["batch_size"]["reason"]
    assert "pass memory_budget= to bound it" in by["batch_size"]["reason"]  # the library's words; the table reads flags
    assert by["data_loading"]["value"]["num_workers"] >= 1
    assert Store(db_url).get_run(d["run_id"]).kind == "recommend"
    bad = runner.invoke(app, ["recommend", "digits-mlp", "--memory-budget", "lots", "--profile", str(path),
                              "--db", db_url])
    assert bad.exit_code == 2
