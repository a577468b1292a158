"""The health stage stops on an error the search cannot fix, and goes on where the error is the
learning rate the search tunes (issue 45: a task whose default lr is 10x too high is what the loop
is for, not a reason to stop before it)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from proftune.diagnose import Finding
from proftune.exceptions import RunFailedError
from proftune.optimize import _builtin
from proftune.optimize._records import BaselineOutputs, HealthOutputs


def _finding(cause: str) -> Finding:
    return Finding(cause=cause, severity="error", summary=f"{cause} seen", fix="do something")


def _loop(findings: list[Finding], *, space: Any = None, ignore: bool = False, tmp: Any) -> Any:
    baseline = BaselineOutputs(findings=findings)
    return SimpleNamespace(state=SimpleNamespace(record=lambda kind: baseline),
                           cfg=SimpleNamespace(ignore_findings=ignore, space=space, seed=0),
                           task=None, defaults={}, dev="cpu", store=None, out=tmp,
                           planner=SimpleNamespace(epoch_s=lambda: 1.0), defaults_record=None)


@pytest.fixture
def no_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    prof = SimpleNamespace(save=lambda path: None, step=SimpleNamespace(time_ms=1.0, throughput=1.0),
                           memory=SimpleNamespace(peak_bytes=1), params=SimpleNamespace(total=1), macs=1)
    monkeypatch.setattr(_builtin, "run_profile", lambda *a, **k: prof)
    monkeypatch.setattr(_builtin.measures, "step_s", lambda *a: 0.01)  # the task is no task: a step of 10 ms


@pytest.mark.usefixtures("no_profile")
@pytest.mark.parametrize("cause", ["lr_too_high", "no_warmup",  # a full-rate start that climbs: the rate too
                                   "batchnorm_small_batch"])  # batch 2 under batch norm: the search tunes the batch
def test_an_lr_error_goes_on_and_says_the_search_tunes_it(cause: str, tmp_path: Any) -> None:
    out = _builtin.Health().run(_loop([_finding(cause)], tmp=tmp_path), 1.0, 0.0).outputs
    assert isinstance(out, HealthOutputs)
    assert out.searched == [cause]
    assert not out.ignored
    assert [f.cause for f in out.errors] == [cause]


@pytest.mark.usefixtures("no_profile")
@pytest.mark.parametrize(("cause", "space"), [
    ("nan_inf", None),  # not a rate the search tunes: it stops
    ("unshuffled_data", None),
    ("lr_too_high", {"params": {"batch_size": {"type": "categorical", "choices": [16, 32]}}}),  # lr not searched
    ("batchnorm_small_batch", {"params": {"lr": {"type": "float", "low": 1e-4, "high": 1e-1}}}),  # nor the batch
])
def test_an_error_the_search_does_not_tune_stops_the_loop(cause: str, space: Any, tmp_path: Any) -> None:
    with pytest.raises(RunFailedError, match=rf"(?s)error finding\(s\) the search does not tune.*{cause}"):
        _builtin.Health().run(_loop([_finding(cause)], space=space, tmp=tmp_path), 1.0, 0.0)
    # --ignore-findings goes on, and the record says so
    out = _builtin.Health().run(_loop([_finding(cause)], space=space, ignore=True, tmp=tmp_path), 1.0, 0.0).outputs
    assert isinstance(out, HealthOutputs)
    assert out.ignored


@pytest.mark.usefixtures("no_profile")
@pytest.mark.parametrize(("at_init", "stops"), [(False, False), (True, True)])
def test_units_that_died_while_training_are_the_rate_s_and_from_init_the_init_s(at_init: bool, stops: bool,
                                                                              tmp_path: Any) -> None:
    """SGD at 4x its rate killed a ReLU layer: the search lowers the rate, so the loop goes on;
    units dead from init are the init's, which no rate fixes: it stops."""
    dead = Finding(cause="dead_units", severity="error", summary="ReLU outputs zero", fix="lower the lr",
                   evidence={"zero_frac": 0.98, "dead_from_init": at_init})
    if stops:
        with pytest.raises(RunFailedError, match="dead_units"):
            _builtin.Health().run(_loop([dead], tmp=tmp_path), 1.0, 0.0)
    else:
        out = _builtin.Health().run(_loop([dead], tmp=tmp_path), 1.0, 0.0).outputs
        assert isinstance(out, HealthOutputs)
        assert out.searched == ["dead_units"]


@pytest.mark.parametrize(("beside", "stops"), [("lr_too_high", False), ("exploding_gradients", False),
                                               ("no_warmup", True), (None, True)])
def test_units_dead_from_the_first_step_at_a_rate_the_same_training_blames_are_the_rate_s(
        beside: str | None, stops: bool) -> None:
    """A rate 51x too high killed a CNN's ReLU by the first sampled step (74% zeros at init, 100%
    after): "from init" there is the rate's, which the same training's lr finding says; the loop
    stopped before any search where a plain loop reached 0.95. Without such a finding (a note that
    the run has no warm-up blames nothing) the init is the cause and the loop stops."""
    from proftune.optimize._health_gate import stopping_findings

    dead = Finding(cause="dead_units", severity="error", summary="ReLU outputs zero", fix="lower the lr",
                   evidence={"zero_frac": 1.0, "dead_from_init": True})
    findings = [dead] + ([Finding(cause=beside, severity="info" if beside == "no_warmup" else "warning",
                                  summary="the rate", fix="lower it", evidence={})] if beside else [])
    assert (stopping_findings(findings, searched=frozenset({"lr", "batch_size"})) == [dead]) is stops
    # where the search does not tune the rate, nothing about it lets the loop go on
    assert stopping_findings(findings, searched=frozenset({"batch_size"})) == [dead]


def _baseline_loop(tmp: Any, *, space: Any = None) -> Any:
    from tests.optimize.tasks import TinyTask

    from proftune.train import TrainParams

    task = TinyTask()
    return SimpleNamespace(task=task, defaults=dict(task.default_params), defaults_record=TrainParams.of(task),
                           dev="cpu", store=None, out=tmp,
                           holdout=None, v=SimpleNamespace(metric="accuracy", budget_s=60.0),
                           cfg=SimpleNamespace(seed=0, space=space, ignore_findings=False))


def _fake_diagnose(calls: list[dict[str, Any]], findings: list[list[Finding]]) -> Any:
    def run(task: Any, params: Any, **kw: Any) -> Any:
        calls.append(kw)
        return SimpleNamespace(metrics={"accuracy": 0.5}, findings=findings[len(calls) - 1], epochs=2, steps=12,
                               duration_s=0.1, run_id=None, stop_reason="done")
    return run


@pytest.mark.parametrize(("space", "confirmed"), [
    (None, False),  # the default space searches lr: the compute stage measures it, no confirmation here
    ({"params": {"batch_size": {"type": "categorical", "choices": [16, 32]}}}, True),  # lr fixed: confirmed
])
def test_the_baseline_confirms_an_lr_finding_only_where_the_search_does_not_tune_the_rate(
        space: Any, confirmed: bool, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The range test and the probes of the health checks took up to three trainings' time of a
    small task's budget at 8 trainings (seq-transformer: 3.5 s against 0.7 s for the training)."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(_builtin, "diagnose", _fake_diagnose(calls, [[_finding("lr_too_low")]]))
    out = _builtin.Baseline().run(_baseline_loop(tmp_path, space=space), 10.0, 1e12).outputs
    assert isinstance(out, BaselineOutputs)
    assert len(calls) == 1
    assert calls[0]["lr_test"] is confirmed
    assert calls[0]["probes"] is confirmed


def test_an_error_that_would_stop_the_loop_is_confirmed_on_a_second_training(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN may be the rate's (the range test then says so, and the loop goes on): where the cheap
    training finds an error the search does not tune, the health checks run in full before any stop."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(_builtin, "diagnose", _fake_diagnose(calls, [[_finding("nan_inf")], [_finding("lr_too_high")]]))
    out = _builtin.Baseline().run(_baseline_loop(tmp_path), 10.0, 1e12).outputs
    assert isinstance(out, BaselineOutputs)
    assert [(c.get("lr_test", True), c.get("probes", True)) for c in calls] == [(False, False), (True, True)]
    assert [f.cause for f in out.findings] == ["lr_too_high"]
