"""The built-in char-gpt task: its corpus, its split, its schedule through the fit loop, and that it learns."""

from __future__ import annotations

import itertools
import math
from typing import ClassVar

import pytest
import torch

import proftune
from proftune.examples._chargpt import CharGPTTask, corpus
from proftune.exceptions import TaskLoadError
from proftune.metrics import default_objective, direction, resolve_direction
from proftune.task import TaskWrapper
from proftune.train import evaluate_model, fit


class TinyCharGPT(CharGPTTask):
    """A slice of the corpus and short epochs: the same task, a few steps."""

    byte_budget: ClassVar[int] = 300_000
    default_epochs: ClassVar[int] = 3
    samples_per_epoch: ClassVar[int] = 96
    eval_windows: ClassVar[int] = 48


def test_builtin_name_loads_and_is_listed() -> None:
    task = proftune.load_task("char-gpt")
    assert isinstance(task, CharGPTTask)
    assert "char-gpt" in proftune.examples.BUILTIN_TASKS
    assert task.default_params["batch_size"] == 12
    assert task.default_params["n_embd"] == 128
    assert task.default_epochs * task.steps_per_epoch(12) == 2000  # nanoGPT's max_iters


def test_split_is_deterministic_and_disjoint_by_file() -> None:
    a = corpus.__wrapped__(TinyCharGPT.byte_budget)  # read again, not the cached one
    b = corpus.__wrapped__(TinyCharGPT.byte_budget)
    assert a.fingerprint == b.fingerprint
    assert a.files == b.files
    assert torch.equal(a.train, b.train)
    assert torch.equal(a.test, b.test)
    train, val, test = (set(a.files[k]) for k in ("train", "val", "test"))
    assert min(len(train), len(val), len(test)) > 0
    assert not train & test
    assert not val & test
    assert not train & val
    # another budget reads other files, so its fingerprint differs
    assert corpus.__wrapped__(TinyCharGPT.byte_budget // 2).fingerprint != a.fingerprint


def test_missing_sources_are_one_clear_error(tmp_path) -> None:
    with pytest.raises(TaskLoadError, match="holds none"):
        corpus.__wrapped__(1000, str(tmp_path / "absent"))
    (tmp_path / "one.py").write_text("x = 1\n")
    with pytest.raises(TaskLoadError, match="too little text"):
        corpus.__wrapped__(1000, str(tmp_path))


def test_loss_only_metrics_are_known_to_the_registry() -> None:
    assert default_objective(["val_loss", "perplexity", "bits_per_char"]) == "val_loss:min"
    assert direction("val_loss") == "min"
    assert direction("perplexity") == "min"
    assert resolve_direction("bits_per_char", task=CharGPTTask()) == "min"


def test_trains_with_warmup_and_cosine_through_the_fit_loop() -> None:
    task = TinyCharGPT()
    params = {"lr": 3e-3, "warmup": 5, "batch_size": 12}
    model = task.build_model({**task.default_params, **params})
    before = evaluate_model(task, model, torch.device("cpu"), 24)["val_loss"]
    assert before == pytest.approx(math.log(256), abs=0.3)  # an untrained byte model is uniform
    result = fit(task, params, epochs=3, device="cpu", seed=0)
    lrs = [s["lr"] for s in result.curves["step"]]
    assert result.steps == 3 * task.steps_per_epoch(12) == len(lrs)
    assert lrs[0] < lrs[4] == pytest.approx(lrs[5], rel=0.2)  # warm-up to the peak
    assert lrs[5] == pytest.approx(3e-3, rel=0.05)
    assert lrs[-1] == pytest.approx(3e-4, rel=0.2)  # the cosine ends at lr / 10
    assert all(a >= b for a, b in itertools.pairwise(lrs[5:]))
    assert result.metrics["val_loss"] < before - 1.0
    assert result.metrics["bits_per_char"] == pytest.approx(result.metrics["val_loss"] / math.log(2))
    test = evaluate_model(task, result.model, torch.device("cpu"), 24, split="test")
    assert test["val_loss"] < before - 1.0
    again = fit(task, params, epochs=3, device="cpu", seed=0)
    assert again.metrics["val_loss"] == pytest.approx(result.metrics["val_loss"], rel=1e-5)


def test_max_steps_plans_the_schedule_and_wrappers_keep_it() -> None:
    task = TaskWrapper(TinyCharGPT())
    # warm-up 4 of the protocol's 24 steps: a run of 6 steps warms up for 1
    result = fit(task, {"warmup": 4}, max_steps=6, device="cpu", seed=0, evaluate=False)
    lrs = [s["lr"] for s in result.curves["step"]]
    assert len(lrs) == 6
    assert lrs[0] < lrs[1]
    assert lrs[1] == pytest.approx(1e-3, rel=0.01)
    assert all(a > b for a, b in itertools.pairwise(lrs[1:]))


@pytest.mark.slow
def test_the_defaults_train_to_nanogpts_regime() -> None:
    """One full training of the defaults (2000 steps; ~100 s on a free 2-core machine): measured
    1.644 / 1.651 validation loss over seeds 0 / 1, against 5.5 untrained."""
    task = proftune.load_task("char-gpt")
    result = fit(task, device="cpu", seed=0)
    assert result.steps == 2000
    assert result.metrics["val_loss"] < 1.75
    test = evaluate_model(task, result.model, torch.device("cpu"), 12, split="test")
    assert test["val_loss"] < 1.75
