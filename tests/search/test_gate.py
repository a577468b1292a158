"""The gate produces every profile metric the registry lists (bug 4: latency_ms was never produced)."""

from __future__ import annotations

import math

import pytest

from proftune.exceptions import ProblemCollector
from proftune.metrics import METRICS
from proftune.search import Constraint, GateResult, ProfileGate, parse_constraint
from proftune.search._constraints import PROFILE_METRICS
from proftune.task import load_task

PROFILE = sorted(name for name, m in METRICS.items() if m.is_profile)


def test_profile_metrics_are_the_registrys() -> None:
    assert sorted(PROFILE_METRICS) == PROFILE
    assert "latency_ms" in PROFILE
    assert "size_bytes" in PROFILE


def _loose(metric: str) -> Constraint:
    """A constraint on ``metric`` that any measured value meets."""
    text = f"{metric}<1e30" if METRICS[metric].direction == "min" else f"{metric}>-1"
    c = parse_constraint(text, ProblemCollector())
    assert c is not None
    return c


@pytest.fixture(scope="module")
def measured() -> GateResult:
    """One gate asked for every profile metric at once (each stage runs once)."""
    gate = ProfileGate([_loose(m) for m in PROFILE], steps=2, warmup=1, device="cpu")
    return gate.check(load_task("wine-mlp"), {"hidden": 16})


@pytest.mark.parametrize("metric", PROFILE)
def test_the_gate_returns_every_profile_metric(metric: str, measured: GateResult) -> None:
    assert metric in measured.metrics, measured.metrics
    value = measured.metrics[metric]
    assert math.isfinite(value)
    assert value >= 0
    assert measured.feasible
    assert _loose(metric).key in measured.violations
    if metric != "grad_var":  # the variance of two norms may be 0; everything else is positive
        assert value > 0


def test_latency_alone_is_the_forward_at_batch_one() -> None:
    """Bug 4: a latency_ms constraint passed validation, then every trial failed."""
    result = ProfileGate([_loose("latency_ms")], steps=3, device="cpu").check(load_task("wine-mlp"), {})
    assert result.source == "inference"
    assert set(result.metrics) == {"latency_ms"}


def test_a_broken_static_constraint_runs_no_step() -> None:
    problems = ProblemCollector()
    small = parse_constraint("params<10", problems)
    slow = parse_constraint("step_time_ms<1e9", problems)
    assert small is not None
    assert slow is not None
    result = ProfileGate([small, slow], device="cpu").check(load_task("wine-mlp"), {"hidden": 16})
    assert not result.feasible
    assert result.source == "static"
    assert "step_time_ms" not in result.metrics
    assert "params=" in result.reasons[0]
