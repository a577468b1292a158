"""The generated benchmark's tasks (issue 60) are drawn, not written: one seed draws the same
tasks every time and another seed others; each drawn task is a real Task that trains, with train /
val / test splits that do not overlap; and the draws cover the space the issue names."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from generated_tasks import (  # noqa: E402
    DATA_KINDS,
    MISTAKE_KINDS,
    MODEL_KINDS,
    OPTIMIZER_KINDS,
    SPACE_MAX_S,
    GeneratedTask,
    draw,
    draw_tasks,
)

import proftune  # noqa: E402
from proftune.train import evaluate_model, fit  # noqa: E402


def _first_batch(task: GeneratedTask) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    params = dict(task.default_params)
    x, y = next(iter(task.train_data(int(params["batch_size"]), params)))
    return x, y


def test_one_seed_draws_the_same_tasks_and_another_seed_others() -> None:
    a, b = draw_tasks(1, 5, max_training_s=3.0), draw_tasks(1, 5, max_training_s=3.0)
    assert [t.description for t in a] == [t.description for t in b]
    for s, t in zip(a, b, strict=True):
        xs, ys = _first_batch(s)
        xt, yt = _first_batch(t)
        assert torch.equal(xs, xt)
        assert torch.equal(ys, yt)
    assert [t.description for t in draw_tasks(1, 3, max_training_s=3.0)] == [t.description for t in a[:3]]
    other = draw_tasks(2, 5, max_training_s=3.0)
    assert sum(s.description != t.description for s, t in zip(a, other, strict=True)) >= 4


def test_the_cap_bounds_the_estimated_training_and_says_so() -> None:
    free = [draw(3, i) for i in range(30)]
    capped = [draw(3, i, max_training_s=1.0) for i in range(30)]
    assert max(s.est_s for s in free) > 10.0  # the space has trainings of many seconds
    assert max(s.est_s for s in free) <= SPACE_MAX_S
    assert min(s.est_s for s in free) < 0.5
    for f, c in zip(free, capped, strict=True):
        if f.est_s <= 1.0 and not f.capped:
            assert c == f
        else:
            assert c.capped.startswith("was ")
            assert c.n_train <= f.n_train
            assert c.epochs <= f.epochs
            assert c.est_s <= 1.0 or (c.epochs == 1 and c.n_train == 50)


@pytest.mark.parametrize("index", range(12))
def test_a_drawn_task_trains_a_step_and_evaluates_on_disjoint_splits(index: int) -> None:
    task = draw_tasks(5, index + 1, max_training_s=3.0)[index]
    assert isinstance(task, proftune.Task)
    assert "mistakes:" in task.description
    x_tr, _, x_va, _, x_te, y_te = task._tensors()
    assert len(x_te) == len(y_te) == task.spec.n_test
    assert len(x_tr) == task.spec.n_train
    train_rows = {r.flatten().numpy().tobytes() for r in x_tr}
    assert not any(r.flatten().numpy().tobytes() in train_rows for r in x_va[:100])
    assert not any(r.flatten().numpy().tobytes() in train_rows for r in x_te[:100])
    val_rows = {r.flatten().numpy().tobytes() for r in x_va}
    assert not any(r.flatten().numpy().tobytes() in val_rows for r in x_te[:100])
    res = fit(task, seed=0, device="cpu", max_steps=1)
    assert res.steps == 1
    assert torch.isfinite(torch.tensor(res.metrics["val_loss"]))
    bs = int(res.params["batch_size"])
    val = evaluate_model(task, res.model, torch.device("cpu"), bs)
    test = evaluate_model(task, res.model, torch.device("cpu"), bs, split="test")
    assert 0.0 <= val["accuracy"] <= 1.0
    assert 0.0 <= test["accuracy"] <= 1.0


def test_sixty_draws_cover_the_named_kinds() -> None:
    specs = [draw(11, i, max_training_s=3.0) for i in range(60)]
    assert {s.data for s in specs} == set(DATA_KINDS)
    assert {s.model for s in specs} == set(MODEL_KINDS)
    assert {s.optimizer for s in specs} == set(OPTIMIZER_KINDS)
    assert {k for s in specs for k, _ in s.mistakes} == set(MISTAKE_KINDS)
    assert any(len(s.mistakes) == 2 for s in specs)
    assert any(s.label_noise > 0 for s in specs)
    assert min(s.n_train for s in specs) <= 100
    assert max(s.n_train for s in specs) >= 1000


def test_the_users_optimizer_and_schedule_are_the_drawn_ones() -> None:
    specs = [draw(11, i) for i in range(60)]
    sgd = next(s for s in specs if s.optimizer == "sgd-step")
    task = GeneratedTask(sgd)
    params = dict(task.default_params)
    model = task.build_model(params)
    opt = task.configure_optimizer(model, params)
    assert isinstance(opt, torch.optim.SGD)
    assert opt.param_groups[0]["momentum"] == 0.9
    sched = task.configure_scheduler(opt, params, epochs=3, max_steps=None)
    assert isinstance(sched, torch.optim.lr_scheduler.StepLR)
    adam = GeneratedTask(next(s for s in specs if s.optimizer == "adam-l2"))
    opt = adam.configure_optimizer(adam.build_model(dict(adam.default_params)), dict(adam.default_params))
    assert type(opt) is torch.optim.Adam
    assert opt.param_groups[0]["weight_decay"] == adam.default_params["weight_decay"]


def _runner() -> Any:
    spec = importlib.util.spec_from_file_location("proftune_bench_generated", BENCH / "generated.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_runner_refuses_bad_arguments_before_any_work(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    gen = _runner()
    out = tmp_path / "r.json"
    out.write_text("{}")
    for argv, says in ((["--out", str(out)], "--force"), (["--resume"], "--resume needs --out"),
                       (["--budgets", "60", "--vs-optuna-at", "32"], "--budgets must include 8"),
                       (["--budgets", "0"], "--budgets must be positive")):
        with pytest.raises(SystemExit):
            gen.parse(argv)
        assert says in capsys.readouterr().err
    assert out.read_text() == "{}"
    args = gen.parse(["--out", str(out), "--resume", "--seed", "3", "--n", "5"])
    assert args.budgets == [8.0, 60.0]
    assert args.reps == 1


def _record(index: int, ours: float, tpe: float, defaults: float, n: int = 400) -> dict[str, Any]:
    arm = {"decision": "chosen", "changed": "lr", "trials": 3}
    return {"name": f"gen-0-{index}", "index": index, "description": f"task {index}", "test_n": n,
            "defaults": [{"test": defaults}],
            "budgets": {"8": {"budget_s": 8.0, "ours": [{**arm, "test": ours}], "optuna-tpe": [{**arm, "test": tpe}],
                              "optuna-hyperband": [{**arm, "test": float("nan")}]}}}


def test_the_summary_counts_against_each_tasks_noise(capsys: pytest.CaptureFixture[str]) -> None:
    gen = _runner()
    diff, se = gen.paired([0.9], [0.8], 100)
    assert diff == pytest.approx(0.1)
    assert se == pytest.approx(math.sqrt(0.9 * 0.1 / 100 + 0.8 * 0.2 / 100))
    # SE of a pair near 0.9 on 400 test samples: ~0.021
    results = [_record(0, 0.90, 0.91, 0.80),   # within one SE of Optuna
               _record(1, 0.80, 0.90, 0.80),   # behind Optuna beyond noise; at the defaults
               _record(2, 0.70, 0.90, 0.85),   # below the defaults beyond noise: the worst
               _record(3, 0.95, 0.90, 0.50)]
    stats = gen.summary(results, ["8"])["8"]
    assert stats["tasks"] == 4
    assert stats["within_one_se"] == 2
    assert stats["below_defaults"] == ["gen-0-2"]
    assert stats["worst"][:2] == ["gen-0-2", "gen-0-1"]
    # a Hyperband arm with nothing (NaN) counts as its user's defaults
    assert stats["diffs"]["optuna-hyperband"] == pytest.approx([0.10, 0.0, -0.15, 0.45])
    assert "worst five against optuna-tpe" in capsys.readouterr().out


def test_the_criterions_ceiling_is_the_plain_loop_against_itself(capsys: pytest.CaptureFixture[str]) -> None:
    # --tpe-again: the same loop at another seed; within one SE of itself on 2 of 3 tasks
    results = [_record(0, 0.90, 0.91, 0.80), _record(1, 0.80, 0.90, 0.80), _record(2, 0.85, 0.85, 0.80)]
    for rec, again in zip(results, (0.90, 0.80, 0.86), strict=True):
        rec["budgets"]["8"]["tpe-again"] = [{"test": again, "trials": 4}]
    gen = _runner()
    gen.summary(results, ["8"])
    out = capsys.readouterr().out
    assert "optuna-tpe at another seed - optuna-tpe: mean -0.0333" in out
    assert ">= optuna-tpe - one SE 2/3 (67%)" in out
    gen.summary([_record(0, 0.9, 0.9, 0.8)], ["8"])  # none ran: no line
    assert "another seed" not in capsys.readouterr().out
    args = gen.parse(["--tpe-again", "--budgets", "8"])
    assert args.tpe_again


@pytest.mark.parametrize(("n", "batch", "sizes"), [(9, 4, [4, 4]), (10, 4, [4, 4, 2]), (3, 1, [1, 1, 1])])
def test_training_batches_drop_only_a_last_partial_batch_of_one(n: int, batch: int, sizes: list[int]) -> None:
    from generated_tasks import _NoSingles

    batches = _NoSingles(torch.arange(n).float()[:, None], torch.arange(n), batch, shuffle=True)
    assert [len(y) for _, y in batches] == sizes
    assert len(batches) == len(sizes)


@pytest.fixture
def _threads_back(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The runner sets one thread for the process (torch and ``PROFTUNE_THREADS``): put both back."""
    monkeypatch.setenv("PROFTUNE_THREADS", "1")
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.usefixtures("_threads_back")
def test_the_runner_measures_every_arm_and_resumes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gen = _runner()
    out = tmp_path / "r.json"
    argv = ["--seed", "1", "--budgets", "2", "--max-training-s", "0.3", "--unit-floor-s", "0.5", "--out", str(out)]
    gen.main([*argv, "--n", "1"])
    first = json.loads(out.read_text())
    (rec,) = first["results"]
    assert "error" not in rec
    cell = rec["budgets"]["2"]
    for arm in ("ours", "optuna-tpe", "optuna-hyperband"):
        assert 0.0 <= cell[arm][0]["test"] <= 1.0
    assert cell["budget_s"] == pytest.approx(2 * rec["unit_s"])
    gen.main([*argv, "--n", "2", "--resume"])
    second = json.loads(out.read_text())
    assert [r["name"] for r in second["results"]] == ["gen-1-0", "gen-1-1"]
    assert second["results"][0] == rec  # kept, not measured again
    printed = capsys.readouterr().out
    assert "1 kept from" in printed
    assert "ours - optuna-tpe" in printed
