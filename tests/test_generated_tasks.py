"""The generated benchmark's tasks (issue 60) are drawn, not written: one seed draws the same
tasks every time and another seed others; each drawn task is a real Task that trains, with train /
val / test splits that do not overlap; and the draws cover the space the issue names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

from generated_tasks import (  # noqa: E402
    DATA_KINDS,
    MISTAKE_KINDS,
    MODEL_KINDS,
    OPTIMIZER_KINDS,
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
    assert max(s.est_s for s in free) > 1.0  # the uncapped space has trainings beyond a second
    for f, c in zip(free, capped, strict=True):
        if f.est_s <= 1.0:
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
