"""diagnose() names the right cause first for each deliberately broken task; a healthy one is clean."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import proftune
from proftune.diagnose import HealthCheck, flatten_findings

from .broken_tasks import (
    BROKEN,
    DeepReLU3xHe,
    HealthySGD,
    Memorise,
    NoDecay,
    PostLNNoWarmup,
    SlowSGD,
    TanhRawFeatures,
)

EPOCHS = 3


@pytest.mark.parametrize("cause", sorted(BROKEN))
def test_broken_task_gets_its_cause_first(cause: str) -> None:
    report = proftune.diagnose(BROKEN[cause](), epochs=EPOCHS, record=False)
    top = report.top
    assert top is not None, f"no finding for the {cause} task"
    assert top.cause == cause, [f.to_dict() for f in report.findings]
    assert top.severity in ("warning", "error")
    assert top.evidence
    assert top.fix


@pytest.mark.parametrize("task", [HealthySGD(), "digits-mlp"])
def test_healthy_task_has_nothing_above_info(task: object) -> None:
    report = proftune.diagnose(task, epochs=EPOCHS, record=False)  # type: ignore[arg-type]
    assert [f.cause for f in report.findings if f.severity != "info"] == []
    assert report.metrics["accuracy"] > 0.85
    assert report.to_dict()["healthy"] is True


def test_evidence_names_step_and_layer() -> None:
    nan = proftune.diagnose(BROKEN["nan_inf"](), epochs=1, record=False).top
    assert nan is not None
    assert nan.layer == "3"
    assert nan.step == 1
    assert nan.evidence["type"] == "Log"
    assert nan.evidence["inputs_finite"] is True
    big = proftune.diagnose(BROKEN["exploding_gradients"](), epochs=1, record=False).top
    assert big is not None
    assert big.layer == "3"
    assert big.evidence["culprit"]["times_reference"] > 50
    high = proftune.diagnose(BROKEN["lr_too_high"](), epochs=2, record=False).top
    assert high is not None
    assert high.evidence["range_test"]["best_lr"] < 1.0 <= high.evidence["lr"]


def test_lr_findings_need_the_range_test_to_be_confident() -> None:
    off = proftune.diagnose(BROKEN["lr_too_low"](), epochs=EPOCHS, record=False, lr_test=False).top
    on = proftune.diagnose(BROKEN["lr_too_low"](), epochs=EPOCHS, record=False).top
    assert off is not None
    assert on is not None
    assert off.cause == on.cause == "lr_too_low"
    assert on.confidence > off.confidence
    assert on.evidence["range_test"]["best_lr"] >= 30 * on.evidence["lr"]


def test_diagnose_is_recorded_with_its_findings(db_url: str) -> None:
    report = proftune.diagnose(BROKEN["dead_units"](), epochs=2, db=db_url)
    run = proftune.Store(db_url).get_run(report.run_id)  # type: ignore[arg-type]
    assert run.kind == "diagnose"
    assert run.status == "finished"
    assert run.result["findings"][0]["cause"] == "dead_units"
    assert run.result["healthy"] is False


def test_batchnorm_with_tiny_batch() -> None:
    report = proftune.diagnose("digits-cnn", {"batch_size": 4, "width": 4}, max_steps=12, record=False)
    causes = {f.cause: f for f in flatten_findings(report.findings)}
    assert causes["batchnorm_small_batch"].severity == "warning"
    assert causes["batchnorm_small_batch"].evidence["batch_size"] == 4


def test_vanishing_gradients_in_a_deep_sigmoid_stack() -> None:
    class DeepSigmoid(HealthySGD):
        name = "digits-deep-sigmoid"

        def build_model(self, params: dict) -> nn.Module:  # type: ignore[type-arg]
            layers: list[nn.Module] = [nn.Linear(64, 32), nn.Sigmoid()]
            for _ in range(8):
                layers += [nn.Linear(32, 32), nn.Sigmoid()]
            return nn.Sequential(*layers, nn.Linear(32, 10))

    report = proftune.diagnose(DeepSigmoid(), max_steps=30, record=False, lr_test=False)
    found = {f.cause: f for f in flatten_findings(report.findings)}
    assert "vanishing_gradients" in found
    assert found["vanishing_gradients"].evidence["ratio"] < 1e-2


def test_overfitting_on_a_tiny_train_set() -> None:
    from proftune.examples import TensorBatches
    from proftune.examples._sklearn import load_split

    class Tiny(HealthySGD):
        name = "digits-tiny-train"
        default_params: ClassVar[dict[str, Any]] = {"optimizer": "adamw", "lr": 3e-3, "batch_size": 16,
                                                    "weight_decay": 0.0}

        def train_data(self, batch_size: int, params: dict) -> TensorBatches:  # type: ignore[type-arg]
            x, y, _, _ = load_split("digits")
            return TensorBatches(x[:60], y[:60], batch_size, shuffle=True)

    report = proftune.diagnose(Tiny(), epochs=40, record=False, lr_test=False)
    found = {f.cause: f for f in report.findings}
    assert "overfitting" in found, [f.to_dict() for f in report.findings]
    ev = found["overfitting"].evidence
    assert ev["final_val_loss"] > ev["best_val_loss"]
    assert ev["gap_at_end"] > ev["gap_at_best"]


def test_health_check_works_in_a_users_loop_through_the_monitor() -> None:
    from proftune.examples._sklearn import load_split

    torch.manual_seed(0)
    model = BROKEN["dead_units"]().build_model({})
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y, _, _ = load_split("digits")
    check = HealthCheck(every=5)
    with proftune.Monitor(model, opt, every=10, callbacks=[check]) as mon:
        for i in range(0, 64 * 22, 64):  # 22 full batches of the 1437 training images
            loss = nn.functional.cross_entropy(model(x[i : i + 64]), y[i : i + 64])
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    assert mon.findings
    assert mon.findings[0].cause == "dead_units"
    assert mon.findings[0].layer == "1"
    assert mon.findings[0].evidence["dead_from_init"]
    assert "nan_inf" not in {f.cause for f in mon.findings}


def test_half_the_units_dead_is_found_by_unit_not_by_layer_average() -> None:
    class HalfDead(HealthySGD):
        name = "digits-half-dead"

        def build_model(self, params: dict[str, Any]) -> nn.Module:
            model = super().build_model(params)
            with torch.no_grad():
                model[0].bias[:80].fill_(-10.0)
            return model

    report = proftune.diagnose(HalfDead(), epochs=2, record=False, lr_test=False)
    found = {f.cause: f for f in report.findings}
    assert "dead_units" in found, [f.to_dict() for f in report.findings]
    ev = found["dead_units"].evidence
    assert ev["zero_frac"] < 0.9
    assert ev["dead_unit_frac"] >= 0.5
    assert ev["dead_from_init"]
    assert found["dead_units"].layer == "1"


def test_monitor_finds_the_layer_that_made_the_first_nan() -> None:
    from proftune.examples._sklearn import load_split

    torch.manual_seed(0)
    model = BROKEN["nan_inf"]().build_model({})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y, _, _ = load_split("digits")
    with proftune.Monitor(model, opt, every=10, callbacks=[HealthCheck()]) as mon:
        for i in range(0, 64 * 3, 64):
            loss = nn.functional.cross_entropy(model(x[i : i + 64]), y[i : i + 64])
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    top = mon.findings[0]
    assert top.cause == "nan_inf"
    assert top.layer == "3"
    assert top.evidence["type"] == "Log"


def test_nan_in_the_data_is_blamed_on_the_data() -> None:
    from proftune.examples import TensorBatches
    from proftune.examples._sklearn import load_split

    class NaNData(HealthySGD):
        name = "digits-nan-data"

        def train_data(self, batch_size: int, params: dict[str, Any]) -> TensorBatches:
            x, y, _, _ = load_split("digits")
            x = x.clone()
            x[3, 7] = float("nan")
            return TensorBatches(x, y, batch_size, shuffle=False)

    top = proftune.diagnose(NaNData(), epochs=1, record=False).top
    assert top is not None
    assert top.cause == "nan_inf"
    assert top.evidence["inputs_finite"] is False
    assert "input batch" in top.summary


def _alarms(report: proftune.DiagnoseResult) -> list[str]:
    return [f.cause for f in report.findings if f.severity in ("warning", "error")]


def test_explosion_is_the_root_and_the_nan_and_dead_units_its_consequences() -> None:
    """Deep ReLU net at 3x He scale, plain SGD: on main, dead_units (warning) came first, then
    exploding_gradients, then nan_inf, and the summary read "0 gradient norm spikes, up to infx"."""
    report = proftune.diagnose(DeepReLU3xHe(), epochs=1, record=False)
    assert _alarms(report) == ["exploding_gradients"]
    top = report.findings[0]
    assert top.severity == "error"
    assert {c.cause for c in top.consequences} >= {"nan_inf", "dead_units"}
    assert all(c.explained_by == "exploding_gradients" for c in top.consequences)
    assert top.evidence["overscale"]["times_he"] == pytest.approx(3.0, rel=0.05)
    assert "3x He scale" in top.summary
    assert "at step 1" in top.summary
    assert "non-finite at step" in top.summary
    assert "0 gradient norm spikes" not in top.summary
    assert "infx" not in top.summary
    assert "explains" in top.why
    d = report.to_dict()["findings"][0]
    assert [c["cause"] for c in d["consequences"]] == [c.cause for c in top.consequences]


def test_memorising_80_samples_is_overfitting_from_the_gap_and_the_curve() -> None:
    """On main: no finding above info (the validation loss rose 12%, under the 25% it needed)."""
    report = proftune.diagnose(Memorise(), epochs=40, record=False, lr_test=False)
    assert _alarms(report) == ["overfitting"]
    ev = report.findings[0].evidence
    assert ev["train_accuracy"] == 1.0
    assert ev["accuracy_gap"] >= 0.07
    assert ev["epochs_since_best"] >= 2
    assert "train accuracy 100.0%" in report.findings[0].summary


def test_batchnorm_over_two_samples_explains_the_noise_it_makes() -> None:
    """On main the noisy loss it caused came out as rivals (lr_too_high, exploding_gradients)."""
    report = proftune.diagnose("digits-cnn", {"batch_size": 2, "width": 8}, max_steps=150, record=False)
    assert _alarms(report) == ["batchnorm_small_batch"]
    rivals = {f.cause for f in report.findings[1:]}
    assert not rivals & {"lr_too_high", "exploding_gradients", "oscillating_loss"}


def test_tanh_on_unscaled_features_is_saturated_activations() -> None:
    report = proftune.diagnose(TanhRawFeatures(), epochs=3, record=False)
    top = report.findings[0]
    assert top.cause == "saturated_activations"
    assert top.layer == "1"
    assert top.evidence["saturated_from_init"] is True
    assert top.evidence["input_rms"] > 10
    assert "standardise the inputs" in top.fix


def test_plain_sgd_at_a_low_rate_is_slow_convergence() -> None:
    report = proftune.diagnose(SlowSGD(), epochs=10, record=False)
    top = report.findings[0]
    assert (top.cause, top.severity) == ("slow_convergence", "warning")
    assert 0.1 <= top.evidence["relative_drop"] <= 0.6
    assert top.evidence["range_test"]["best_lr"] >= 10 * top.evidence["lr"]


@pytest.mark.slow  # a 4-layer Transformer for 3 epochs and a 60-step probe: ~6 s idle, minutes under load
def test_post_ln_transformer_without_warmup_is_no_warmup_confirmed_by_the_probe() -> None:
    report = proftune.diagnose(PostLNNoWarmup(), epochs=3, record=False, lr_test=False)
    top = report.findings[0]
    assert (top.cause, top.severity) == ("no_warmup", "warning")
    probe = top.evidence["probe"]
    assert probe["relative_gain"] >= 0.2
    assert probe["loss_with_warmup"] < probe["loss_without"]
    assert f"first {probe['warmup_steps']} steps" in top.fix


def test_constant_rate_on_a_noisy_floor_is_no_lr_decay_confirmed_by_the_probe() -> None:
    report = proftune.diagnose(NoDecay(), epochs=3, record=False)
    top = report.findings[0]
    assert (top.cause, top.severity) == ("no_lr_decay", "warning")
    assert top.evidence["probe"]["decayed_loss"] < 0.9 * top.evidence["probe"]["constant_loss"]
    assert top.evidence["lr"] == 0.05


@pytest.mark.parametrize("task", ["digits-mlp", "wine-mlp"])
def test_builtin_tasks_at_their_defaults_raise_no_alarm(task: str) -> None:
    """optimize's health stage stops on error findings at the task's defaults."""
    assert _alarms(proftune.diagnose(task, record=False)) == []
