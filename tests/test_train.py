"""The fit loop: determinism, callbacks, loop params, stopping."""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar

import pytest
import torch

import proftune
from proftune.exceptions import ConfigError
from proftune.train import Callback, FitState, fit


def test_same_seed_same_metrics() -> None:
    """At a fixed thread count a seed reproduces a run bit for bit; at the computed count (it
    follows the machine's load, and CPU kernels round differently at another count) to rounding."""
    a = fit("digits-mlp", {"lr": 3e-3}, epochs=2, device="cpu", seed=7, threads=1)
    b = fit("digits-mlp", {"lr": 3e-3}, epochs=2, device="cpu", seed=7, threads=1)
    c = fit("digits-mlp", {"lr": 3e-3}, epochs=2, device="cpu", seed=8, threads=1)
    assert a.metrics == b.metrics
    assert [s["loss"] for s in a.curves["step"]] == [s["loss"] for s in b.curves["step"]]
    assert a.metrics != c.metrics
    d = fit("digits-mlp", {"lr": 3e-3}, epochs=2, device="cpu", seed=7)
    assert d.metrics == pytest.approx(a.metrics, rel=1e-4)


def test_digits_cnn_learns() -> None:
    result = fit("digits-cnn", epochs=3, device="cpu")
    assert result.metrics["accuracy"] > 0.9
    assert len(result.curves["epoch"]) == 3
    assert result.steps == 3 * math.ceil(1437 / 64)


class Recorder(Callback):
    def __init__(self, stop_at: int | None = None) -> None:
        self.events: list[str] = []
        self.stop_at = stop_at
        self.grad_seen = False

    def on_fit_start(self, state: FitState) -> None:
        self.events.append("fit_start")

    def on_epoch_start(self, state: FitState) -> None:
        self.events.append("epoch_start")

    def on_step_start(self, state: FitState) -> None:
        self.events.append("step_start")
        assert state.batch is not None

    def on_after_backward(self, state: FitState) -> None:
        self.events.append("after_backward")
        self.grad_seen = all(p.grad is not None for p in state.model.parameters())

    def on_step_end(self, state: FitState) -> None:
        self.events.append("step_end")
        assert state.timing["step_ms"] >= state.timing["forward_ms"] >= 0
        if self.stop_at is not None and state.step >= self.stop_at:
            state.request_stop("enough")

    def on_epoch_end(self, state: FitState) -> None:
        self.events.append("epoch_end")
        assert "accuracy" in state.metrics

    def on_fit_end(self, state: FitState) -> None:
        self.events.append("fit_end")


def test_callback_order_and_stop() -> None:
    rec = Recorder(stop_at=3)
    result = fit("wine-mlp", epochs=5, device="cpu", callbacks=[rec])
    assert rec.events[:5] == ["fit_start", "epoch_start", "step_start", "after_backward", "step_end"]
    assert rec.events[-2:] == ["epoch_end", "fit_end"]
    assert rec.events.count("step_end") == 3
    assert rec.grad_seen
    assert result.stop_reason == "enough"
    assert result.steps == 3
    assert "accuracy" in result.metrics  # the stopped epoch is still evaluated


def test_max_steps_and_grad_accumulation() -> None:
    result = fit("digits-mlp", {"grad_accumulation": 2, "batch_size": 32}, max_steps=5, device="cpu")
    assert result.steps == 5
    assert result.samples == 5 * 2 * 32


@pytest.mark.parametrize("optimizer", ["adamw", "adam", "sgd", "lbfgs"])
def test_optimizers(optimizer: str) -> None:
    params = {"optimizer": optimizer, "lr": 0.5 if optimizer == "lbfgs" else 0.05, "momentum": 0.9}
    result = fit("wine-mlp", params, epochs=3, device="cpu")
    assert type(result.optimizer).__name__.lower() == optimizer
    assert result.metrics["accuracy"] > 0.8


class _MatmulDtypes(Callback):
    """Records the dtype of every Linear output computed with gradients (the training steps)."""

    def __init__(self) -> None:
        self.dtypes: set[torch.dtype] = set()

    def on_fit_start(self, state: FitState) -> None:
        for module in state.model.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_hook(self._record)

    def _record(self, _module: torch.nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        if torch.is_grad_enabled():
            self.dtypes.add(out.dtype)


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)]
)
def test_mixed_precision_trains(precision: str, dtype: torch.dtype) -> None:
    seen = _MatmulDtypes()
    result = fit("wine-mlp", {"precision": precision, "grad_clip": 1.0}, epochs=3, device="cpu",
                 callbacks=[seen])
    assert seen.dtypes == {dtype}  # the matmuls of the training step ran at that precision
    assert result.metrics["accuracy"] > 0.8


def test_nan_loss_stops_and_is_recorded() -> None:
    result = fit("wine-mlp", {"lr": 1e6, "optimizer": "sgd"}, epochs=5, device="cpu")
    assert any(a["kind"] == "nan_loss" for a in result.anomalies)
    assert result.stop_reason is not None
    assert "loss became" in result.stop_reason


def test_bad_params_listed_together() -> None:
    with pytest.raises(ConfigError) as info:
        fit("wine-mlp", {"lr": "abc", "optimizer": "rmsprop", "batch_size": 0}, epochs=1)
    text = str(info.value)
    assert "lr='abc'" in text
    assert "rmsprop" in text
    assert "batch_size=0" in text


def test_epochs_zero_rejected() -> None:
    with pytest.raises(ConfigError, match="epochs"):
        fit("wine-mlp", epochs=0)


def test_an_epoch_with_no_batch_is_refused_not_looped() -> None:
    """With ``max_steps`` alone, training data that yields nothing in an epoch looped forever."""
    task = proftune.load_task("wine-mlp")

    class _Empty(type(task)):  # type: ignore[misc]
        def train_data(self, batch_size: int, params: dict[str, Any]) -> list[Any]:
            return []

    with pytest.raises(ConfigError, match=r"yielded no batch in epoch 1"):
        fit(_Empty(), max_steps=3, device="cpu")


def test_task_params_reach_the_model() -> None:
    result = fit("digits-mlp", {"hidden": 7}, max_steps=1, device="cpu")
    assert result.model[0].out_features == 7


def test_given_model_is_trained_in_place() -> None:
    task = proftune.load_task("wine-mlp")
    torch.manual_seed(0)
    model = task.build_model({})
    before = model[0].weight.detach().clone()
    result = fit(task, model=model, max_steps=2, device="cpu")
    assert result.model is model
    assert not torch.equal(before, model[0].weight)


def test_fit_takes_a_config_or_its_fields_by_name() -> None:
    from proftune import FitConfig

    by_name = fit("wine-mlp", {"lr": 1e-2}, max_steps=6, device="cpu", seed=3, evaluate=False)
    by_config = fit("wine-mlp", {"lr": 1e-2}, FitConfig(max_steps=6, device="cpu", seed=3, evaluate=False))
    losses = [p["loss"] for p in by_name.curves["step"]]
    assert [p["loss"] for p in by_config.curves["step"]] == losses  # the same run, seeded
    assert by_config.steps == 6
    longer = fit("wine-mlp", {"lr": 1e-2}, FitConfig(max_steps=6, device="cpu", evaluate=False), max_steps=9)
    assert longer.steps == 9  # a field by name overrides the config's
    with pytest.raises(ConfigError, match=r"unknown options \['epoch'\]; valid: .*epochs"):
        fit("wine-mlp", epoch=1)


def test_run_step_is_the_one_description_of_a_step() -> None:
    """train.run_step, which fit runs and the predictor traces: each micro-batch's forward then
    backward, the unscale (fp16) in the optimizer's part before after_backward, then clip and step."""
    import contextlib

    from proftune.train import StepPhases, StepSpec, run_step

    calls: list[str] = []

    class Phases(StepPhases):
        def _mark(self, name: str) -> contextlib.AbstractContextManager[None]:
            calls.append(name)
            return contextlib.nullcontext()

        def forward(self) -> contextlib.AbstractContextManager[None]:
            return self._mark("forward")

        def backward(self) -> contextlib.AbstractContextManager[None]:
            return self._mark("backward")

        def optimizer(self) -> contextlib.AbstractContextManager[None]:
            return self._mark("optimizer")

        def after_backward(self, loss: torch.Tensor) -> None:
            calls.append("after_backward")
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]).clone())

    task = proftune.load_task("digits-mlp")
    params = {**task.default_params, "grad_clip": 1e-3}
    torch.manual_seed(0)
    model = task.build_model(params)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [b for _, b in zip(range(3), task.train_data(16, params), strict=False)]
    grads: list[torch.Tensor] = []
    spec = StepSpec.from_params({**params, "precision": "fp16", "grad_accumulation": 3})
    assert spec == StepSpec(precision="fp16", grad_accumulation=3, grad_clip=1e-3)
    scaler = spec.grad_scaler("cpu")
    assert scaler is not None
    losses = run_step(task, model, optimizer, batches, spec, device_type="cpu", scaler=scaler, phases=Phases())
    assert calls == ["forward", "backward"] * 3 + ["optimizer", "after_backward", "optimizer"]
    assert len(losses) == 3
    assert all(not loss.requires_grad for loss in losses)
    # after_backward saw the unscaled gradients: what one fp32 step over the same micro-batches gives
    torch.manual_seed(0)
    reference = task.build_model(params)
    for b in batches:
        (task.loss(reference, b) / 3).backward()
    expected = torch.cat([p.grad.flatten() for p in reference.parameters()])
    assert torch.allclose(grads[0], expected, rtol=0.05, atol=1e-3)
    assert StepSpec.from_params({}).grad_scaler("cpu") is None


def test_a_step_of_one_micro_batch_backpropagates_the_loss_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """No division by one (an autograd node more at every step of every trial, issue 60); with
    accumulation each micro-batch's loss is divided by their count as before."""
    from proftune.train import StepSpec, run_step

    task = proftune.load_task("digits-mlp")
    params = dict(task.default_params)
    torch.manual_seed(0)
    model = task.build_model(params)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [b for _, b in zip(range(2), task.train_data(16, params), strict=False)]
    made: list[torch.Tensor] = []
    backed: list[torch.Tensor] = []
    real_loss, real_backward = task.loss, torch.Tensor.backward

    def loss(m: torch.nn.Module, batch: Any) -> torch.Tensor:
        made.append(real_loss(m, batch))
        return made[-1]

    def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        backed.append(self)
        real_backward(self, *args, **kwargs)

    monkeypatch.setattr(task, "loss", loss)
    monkeypatch.setattr(torch.Tensor, "backward", backward)
    run_step(task, model, optimizer, batches[:1], StepSpec(), device_type="cpu")
    assert backed[0] is made[0]
    run_step(task, model, optimizer, batches, StepSpec(grad_accumulation=2), device_type="cpu")
    assert all(b is not m for b, m in zip(backed[1:], made[1:], strict=True))
    assert [float(b.detach()) for b in backed[1:]] == pytest.approx([float(m.detach()) / 2 for m in made[1:]])


class _Scheduled(proftune.ClassificationTask):
    """Six epochs of 10 steps each, with the scheduler that ``make`` builds (and its config)."""

    name = "scheduled"
    default_params: ClassVar[dict[str, Any]] = {"lr": 0.1, "batch_size": 16, "optimizer": "sgd"}
    default_epochs = 6
    make: Any = None

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(160, 4, generator=g), torch.randint(0, 2, (160,), generator=g)

    def build_model(self, params: dict[str, Any]) -> torch.nn.Module:
        return torch.nn.Linear(4, 2)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Any:
        return [(self.x[i:i + batch_size], self.y[i:i + batch_size]) for i in range(0, 160, batch_size)]

    def val_data(self, batch_size: int) -> Any:
        return [(self.x, self.y)]

    def configure_scheduler(self, optimizer: torch.optim.Optimizer, params: dict[str, Any], *,
                            epochs: int | None, max_steps: int | None) -> Any:
        return type(self).make(optimizer)


def _scheduled(make: Any) -> type[_Scheduled]:
    from proftune import _schedule

    _schedule._WARNED.clear()  # one warning per process: each test starts afresh
    return type("Scheduled", (_Scheduled,), {"make": staticmethod(make)})


def _lrs(result: Any) -> list[float]:
    """The lr of the first step of each epoch."""
    return [s["lr"] for s in result.curves["step"] if (s["step"] - 1) % 10 == 0]


def test_a_scheduler_is_stepped_per_step_by_default_and_per_epoch_when_the_task_says() -> None:
    from proftune.exceptions import TaskWarning

    per_step = _scheduled(lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskWarning)  # step_size=20 > 6 epochs: counted in steps, no warning
        result = fit(per_step, device="cpu", threads=1)
    assert _lrs(result) == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    per_epoch = _scheduled(lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
                                        "interval": "epoch"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskWarning)
        result = fit(per_epoch, device="cpu", threads=1)
    assert _lrs(result) == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    assert not result.anomalies


def test_a_per_epoch_looking_scheduler_stepped_per_step_warns_once_saying_what_to_do() -> None:
    from proftune.exceptions import TaskWarning

    task = _scheduled(lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fit(task, device="cpu", threads=1)
        fit(task, device="cpu", threads=1)  # optimize trains a task many times: still one warning
    caught = [w for w in caught if issubclass(w.category, TaskWarning)]
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "StepLR(step_size=2)" in message
    assert "10 optimizer steps" in message
    assert "'interval': 'epoch'" in message
    assert [a["kind"] for a in result.anomalies] == ["scheduler_interval"]
    assert result.curves["step"][-1]["lr"] < 1e-7  # what the warning is about: 0.5**29 of 0.1
    stated = _scheduled(lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
                                     "interval": "step"})
    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskWarning)  # the task said per step: taken as meant
        fit(stated, device="cpu", threads=1)


@pytest.mark.parametrize("make", [
    lambda opt: torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[3, 5], gamma=0.1),
    lambda opt: torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7),
    lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6),
], ids=["MultiStepLR", "ExponentialLR", "CosineAnnealingLR"])
def test_other_epoch_counted_schedulers_warn_too(make: Any) -> None:
    from proftune.exceptions import TaskWarning

    with pytest.warns(TaskWarning, match="looks counted in epochs") as caught:
        fit(_scheduled(make), device="cpu", threads=1)
    assert len([w for w in caught if issubclass(w.category, TaskWarning)]) == 1  # one warning, not one a step


def test_a_slow_per_step_decay_does_not_warn() -> None:
    from proftune.exceptions import TaskWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", TaskWarning)  # a warning would fail the fit
        result = fit(_scheduled(lambda opt: torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.99)), device="cpu",
                     threads=1)
    assert not any(a["kind"] == "scheduler_interval" for a in result.anomalies)
    assert _lrs(result)[-1] < _lrs(result)[0]  # it decayed, per step, as the task asked


def test_a_plateau_scheduler_steps_per_epoch_on_its_metric_and_bad_configs_are_named() -> None:
    plateau = _scheduled(lambda opt: {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(
        opt, mode="max", patience=0, factor=0.5), "interval": "epoch", "monitor": "accuracy"})
    result = fit(plateau, device="cpu", threads=1)
    assert _lrs(result)[0] == 0.1
    assert min(_lrs(result)) < 0.1  # accuracy stalls on noise labels
    bare_plateau = _scheduled(lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt))
    with pytest.raises(ConfigError, match="'interval': 'epoch'"):
        fit(bare_plateau, device="cpu", threads=1)
    bad = _scheduled(lambda opt: {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 2), "interval": "epochs",
                                  "every": 2})
    with pytest.raises(ConfigError) as err:
        fit(bad, device="cpu", threads=1)
    assert "interval='epochs' is unknown; valid: step, epoch" in str(err.value)
    assert "key 'every' is unknown" in str(err.value)
