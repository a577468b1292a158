"""Each registered check names its cause on a History that shows it, and nothing on a healthy one."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from proftune.diagnose import CAUSES, CHECKS, BaseCheck, Finding, History, StepRecord
from proftune.diagnose.checks._unshuffled import Unshuffled


def _steps(losses: list[float], ratios: list[float] | None = None, lr: float = 0.01) -> list[StepRecord]:
    ratios = ratios or [math.nan] * len(losses)
    return [StepRecord(step=i + 1, loss=v, grad_norm=r if math.isfinite(r) else 1.0, lr=lr,
                       median=1.0 if math.isfinite(r) else math.nan, ratio=r)
            for i, (v, r) in enumerate(zip(losses, ratios, strict=True))]


def _falling(n: int) -> list[float]:
    return [2.0 * 0.95**i for i in range(n)]


def _lr_too_high() -> History:
    return History(steps=_steps(_falling(20) + [0.8 + 0.3 * i for i in range(10)]))


def _lr_too_low() -> History:
    return History(steps=_steps([2.3 - 0.001 * i for i in range(40)]))


def _unshuffled() -> History:
    return History(labels=[torch.full((16,), i // 2, dtype=torch.long) for i in range(8)])


def _exploding() -> History:
    ratios = [1.0] * 10 + [50.0, 1.0, 60.0] + [1.0] * 5
    return History(steps=_steps(_falling(len(ratios)), ratios))


def _vanishing() -> History:
    stats = {name: {"grad": {"norm": norm}} for name, norm in (("0", 1e-7), ("1", 1e-3), ("2", 1.0))}
    return History(samples=[(1, stats), (10, stats)], fan_in=dict.fromkeys(("0", "1", "2"), 16))


def _dead_units() -> History:
    stats = {"1": {"activation": {"zero_frac": 0.995, "dead_frac": 0.97, "nonfinite": 0}}}
    return History(samples=[(1, stats), (10, stats)], types={"0": "Linear", "1": "ReLU"})


def _nan_inf() -> History:
    return History(nonfinite={"step": 5, "phase": "forward", "layer": "2", "type": "Linear",
                              "inputs_finite": True, "loss": math.nan})


def _overfitting() -> History:
    val, train = [1.0, 0.8, 0.9, 1.1, 1.3], [1.0, 0.7, 0.5, 0.3, 0.2]
    return History(epochs=[{"epoch": i + 1, "val_loss": v, "train_loss": t, "step": 10 * (i + 1)}
                           for i, (v, t) in enumerate(zip(val, train, strict=True))])


def _batchnorm() -> History:
    return History(batchnorm=["bn1"], batch_sizes=[4] * 10)


def _saturated() -> History:
    order = {"0": {}, "1": {}, "2": {}}
    return History(saturation={1: {"1": {"type": "Tanh", "saturated_frac": 0.95}}}, samples=[(1, order)],
                   fan_in=dict.fromkeys(("0", "2"), 16), types={"0": "Linear", "1": "Tanh", "2": "Linear"})


def _oscillating() -> History:
    # a falling loss with a square wave of +0.8 every other 10 steps on top
    return History(steps=_steps([2.0 * 0.99**i + (0.8 if (i // 10) % 2 else 0.0) for i in range(100)]),
                   batch_sizes=[4] * 100)


def _slow() -> History:
    return History(steps=_steps([2.3 - 0.008 * i for i in range(100)]))


def _no_warmup() -> History:
    losses = [2.3, 1.8, 1.4, 1.1, 1.0, 1.6, 2.4, 2.5, 2.2] + [2.0 * 0.97**i for i in range(71)]
    return History(steps=_steps(losses), optimizer="AdamW")


def _no_lr_decay() -> History:
    losses = [2.3 * 0.97**i for i in range(100)] + [0.5 + (0.15 if i % 2 else -0.15) for i in range(150)]
    return History(steps=_steps(losses))


SHOWS: dict[str, Callable[[], History]] = {
    "lr_too_high": _lr_too_high, "lr_too_low": _lr_too_low, "unshuffled_data": _unshuffled,
    "exploding_gradients": _exploding, "vanishing_gradients": _vanishing, "dead_units": _dead_units,
    "nan_inf": _nan_inf, "overfitting": _overfitting, "batchnorm_small_batch": _batchnorm,
    "saturated_activations": _saturated, "oscillating_loss": _oscillating, "slow_convergence": _slow,
    "no_warmup": _no_warmup, "no_lr_decay": _no_lr_decay,
}


def _healthy() -> History:
    g = torch.Generator().manual_seed(0)
    stats = {name: {"grad": {"norm": 0.1}, "activation": {"zero_frac": 0.5, "dead_frac": 0.0, "nonfinite": 0}}
             for name in ("0", "1", "2")}
    return History(
        steps=_steps(_falling(40), [1.0] * 40),
        labels=[torch.randint(0, 4, (16,), generator=g) for _ in range(8)],
        samples=[(1, stats), (10, stats)], fan_in=dict.fromkeys(("0", "2"), 16),
        types={"0": "Linear", "1": "ReLU", "2": "Linear"}, batchnorm=["bn1"], batch_sizes=[64] * 8,
        epochs=[{"epoch": i + 1, "val_loss": 1.0 - 0.1 * i, "train_loss": 0.9 - 0.1 * i} for i in range(4)],
    )


def test_every_cause_has_exactly_one_registered_check() -> None:
    assert sorted(c.cause for c in CHECKS) == sorted(CAUSES)
    assert set(SHOWS) == set(CAUSES)
    assert all(isinstance(c, BaseCheck) for c in CHECKS)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.cause)
def test_check_names_its_cause_when_the_history_shows_it(check: BaseCheck) -> None:
    finding = check.check(SHOWS[check.cause]())
    assert isinstance(finding, Finding)
    assert finding.cause == check.cause
    assert finding.summary
    assert finding.fix
    assert 0 < finding.confidence <= 1


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.cause)
def test_check_is_silent_on_a_healthy_history(check: BaseCheck) -> None:
    assert check.check(_healthy()) is None


def test_a_new_check_is_one_subclass() -> None:
    class Always(BaseCheck):
        cause = "overfitting"

        def check(self, history: History) -> Finding | None:
            return Finding(self.cause, "info", f"{len(history.epochs)} epochs", "none")

    assert Always().check(History()) == Finding("overfitting", "info", "0 epochs", "none")
    with pytest.raises(TypeError):
        BaseCheck()  # type: ignore[abstract]


def test_oscillation_names_the_first_of_its_four_causes_that_holds() -> None:
    """Causes are tried in order: learning rate, data order, gradient norm, batch diversity."""
    from proftune.diagnose import RangeTest
    from proftune.diagnose.checks._oscillating import OscillatingLoss

    def found(h: History) -> dict[str, object]:
        f = OscillatingLoss().check(h)
        assert f is not None
        return f.evidence

    small = _oscillating()  # batches of 4, nothing else wrong
    ev = found(small)
    assert [c["name"] for c in ev["causes_checked"]] == ["learning rate", "data order", "gradient norm",
                                                          "batch diversity"]
    assert ev["cause_found"] == "batch diversity"
    spiky = _oscillating()
    for i, r in enumerate(spiky.steps):
        if i % 17 == 16:
            r["ratio"], r["grad_norm"] = 50.0, 50.0
    assert found(spiky)["cause_found"] == "gradient norm"
    assert found(spiky)["attributed_to"] == "exploding_gradients"
    high = _oscillating()
    high.lr_test = RangeTest(lrs=[1e-4, 1e-3], losses=[2.0, 1.0], best_lr=1e-3, improved=True)
    ev = found(high)
    assert ev["cause_found"] == "learning rate"
    assert "0.01 is above the range test's safe maximum 0.001" in ev["causes_checked"][0]["detail"]


def test_saturation_of_the_output_layer_is_not_a_finding() -> None:
    h = _saturated()
    h.fan_in = {"0": 16}  # nothing with weights runs after the Tanh: it is the model's output
    from proftune.diagnose.checks._saturated import SaturatedActivations

    assert SaturatedActivations().check(h) is None


def test_update_ratio_skips_layers_without_one() -> None:
    """A layer whose update ratio LayerStats could not measure (None) is left out, not a crash."""
    stats = {"0": {"grad": {"norm": 1.0, "update_ratio": None}}, "1": {"grad": {"norm": 1.0, "update_ratio": 2e-3}}}
    assert History(samples=[(1, stats)]).update_ratio() == pytest.approx(2e-3)


def test_an_epochs_short_last_batch_is_not_read_as_unshuffled_data() -> None:
    """67 shuffled samples of 10 classes at batch 64: every epoch a batch of 64 and one of 3. The
    short batch holds about 3 labels by its size; judged against a batch of the median size it
    read as unshuffled data, and the health gate stopped a generated task (issue 60)."""
    gen = torch.Generator().manual_seed(0)
    labels = [torch.randint(0, 10, (n,), generator=gen) for _ in range(9) for n in (64, 3)]
    order = History(labels=labels).label_order()
    assert order is not None
    assert order.diversity == pytest.approx(1.0, abs=0.1)
    assert Unshuffled().check(History(labels=labels)) is None
    # the same short batches from sorted data still are
    assert Unshuffled().check(History(labels=[torch.full((n,), i % 10, dtype=torch.long)
                                              for i in range(9) for n in (64, 3)])) is not None
