"""The headroom benchmark's tasks are what they claim (issue 45): six kinds of defaults far from
their best, each with train / val / test splits that do not overlap, and the benchmark refuses
bad arguments before it measures anything."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from headroom_tasks import HEADROOM, HEADROOM_BENCH, PlateauCNN  # noqa: E402

from proftune.train import fit  # noqa: E402


@pytest.mark.parametrize("name", HEADROOM_BENCH)
def test_each_task_has_three_disjoint_splits_and_trains_a_step(name: str) -> None:
    task = HEADROOM[name]()
    x_tr, y_tr, x_va, y_va, x_te, y_te = task._tensors()
    assert len(x_tr) == len(y_tr)
    assert len(x_va) == len(y_va) > 0
    assert len(x_te) == len(y_te) > 0
    rows = {tuple(r.flatten().tolist()) for r in x_tr}
    assert not any(tuple(r.flatten().tolist()) in rows for r in x_te[:50])  # no test sample seen in training
    params = dict(task.default_params)
    batch = next(iter(task.train_data(int(params["batch_size"]), params)))
    loss = task.loss(task.build_model(params), batch)
    assert torch.isfinite(loss)


def test_the_plateau_task_sits_at_chance_at_its_defaults_and_trains_at_a_higher_rate() -> None:
    task = PlateauCNN()
    slow = fit(task, dict(task.default_params), seed=0, device="cpu", epochs=3)
    fast = fit(task, {**task.default_params, "lr": 300 * task.default_params["lr"]}, seed=0, device="cpu", epochs=3)
    assert slow.metrics["accuracy"] < 0.2  # ten classes: chance
    assert fast.metrics["accuracy"] > 0.5


def test_the_benchmark_refuses_an_existing_out_and_bad_budgets(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("proftune_bench_headroom", BENCH / "headroom.py")
    assert spec is not None
    assert spec.loader is not None
    headroom = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headroom)
    out = tmp_path / "r.json"
    out.write_text("{}")
    with pytest.raises(SystemExit):
        headroom.parse(["--out", str(out)])
    assert "--force" in capsys.readouterr().err
    assert out.read_text() == "{}"
    with pytest.raises(SystemExit):
        headroom.parse(["--budgets", "0"])
    assert "--budgets positive" in capsys.readouterr().err
    args = headroom.parse(["--quick", "--out", str(out), "--force"])
    assert args.budgets == [8.0, 16.0]
    assert args.reps == 2
