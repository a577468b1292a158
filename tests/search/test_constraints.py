"""Objectives and constraints: parsing, units, violations, metric names checked."""

from __future__ import annotations

from typing import ClassVar

import pytest

from proftune.exceptions import ProblemCollector
from proftune.search._constraints import parse_constraint, parse_objective, parse_targets


def test_constraint_parsing_units_and_violation_sign() -> None:
    p = ProblemCollector()
    c = parse_constraint("step_time_ms<50", p)
    assert c is not None
    assert (c.metric, c.op, c.threshold) == ("step_time_ms", "<", 50.0)
    assert c.violation(40.0) < 0 < c.violation(60.0)
    assert c.violation(50.0) > 0  # strict: on the limit is outside
    assert c.violation(float("nan")) > 0
    assert "step_time_ms=60 >= 50" in c.reason(60.0)
    mem = parse_constraint("peak_memory_bytes<=2GiB", p)
    assert mem is not None
    assert mem.threshold == 2 * 2**30
    assert mem.violation(2 * 2**30) == 0.0
    acc = parse_constraint("accuracy>=0.9", p)
    assert acc is not None
    assert acc.violation(0.95) < 0 < acc.violation(0.8)
    assert not acc.is_profile
    assert not p


def test_malformed_constraints_and_objectives_are_problems() -> None:
    p = ProblemCollector()
    assert parse_constraint("step_time_ms << 50", p) is None
    assert parse_constraint("step_time_ms<50parsecs", p) is None
    assert parse_objective("accuracy:up", p) is None
    assert len(p.problems) == 3
    # each names the caller's argument (optimize's objective=, search's objectives=), not a flag
    assert p.problems[0].startswith("constraints='step_time_ms << 50' is malformed")
    assert p.problems[1].startswith("constraints='step_time_ms<50parsecs': limit='50parsecs'")
    assert p.problems[2].startswith("objective='accuracy:up': direction 'up'")
    q = ProblemCollector()
    parse_objective("x y", q, name="objectives")
    assert q.problems == ["objectives='x y' is malformed; give METRIC or METRIC:max|min (e.g. 'accuracy:max')."]


def test_time_and_memory_limits_are_read_in_the_metrics_unit() -> None:
    """Bug 5: ``step_time_ms<1s`` was read as 1 ms."""
    p = ProblemCollector()
    one_s = parse_constraint("step_time_ms<1s", p)
    assert one_s is not None
    assert one_s.threshold == 1000.0
    assert parse_constraint("latency_ms<250ms", p).threshold == 250.0  # type: ignore[union-attr]
    assert parse_constraint("step_time_ms<0.5min", p).threshold == 30_000.0  # type: ignore[union-attr]
    assert parse_constraint("peak_memory_bytes<512MB", p).threshold == 512e6  # type: ignore[union-attr]
    assert parse_constraint("size_bytes<4KiB", p).threshold == 4096  # type: ignore[union-attr]
    assert parse_constraint("params<2M", p).threshold == 2e6  # type: ignore[union-attr]
    assert not p


@pytest.mark.parametrize(("text", "valid"), [
    ("step_time_ms<2GiB", "ms, s, min"), ("peak_memory_bytes<3s", "KiB"), ("accuracy>0.9ms", "k, M, G"),
])
def test_a_unit_of_the_wrong_kind_names_the_valid_units(text: str, valid: str) -> None:
    p = ProblemCollector()
    assert parse_constraint(text, p) is None
    assert len(p.problems) == 1
    assert valid in p.problems[0]
    assert text in p.problems[0]


def test_directions_come_from_the_registry_not_the_name() -> None:
    p = ProblemCollector()
    assert parse_objective("accuracy", p).direction == "maximize"  # type: ignore[union-attr]
    assert parse_objective("val_loss", p).direction == "minimize"  # type: ignore[union-attr]
    assert parse_objective("step_time_ms", p).direction == "minimize"  # type: ignore[union-attr]
    assert parse_objective("throughput", p).direction == "maximize"  # type: ignore[union-attr]
    assert parse_objective("mse", p).direction == "minimize"  # type: ignore[union-attr]
    assert parse_objective("r2", p).direction == "maximize"  # type: ignore[union-attr]
    assert not p
    # a name the registry does not know needs a direction, from the user or the task
    assert parse_objective("f1_score", p) is None
    assert "metric_directions" in p.problems[0]

    class Declares:
        metric_directions: ClassVar[dict[str, str]] = {"f1_score": "max", "my_error_rate": "min"}

    q = ProblemCollector()
    assert parse_objective("f1_score", q, task=Declares()).direction == "maximize"  # type: ignore[union-attr]
    assert parse_objective("my_error_rate", q, task=Declares()).direction == "minimize"  # type: ignore[union-attr]
    assert parse_objective("f1_score:min", q).direction == "minimize"  # type: ignore[union-attr]
    assert not q


@pytest.mark.parametrize("metrics", [["val_loss", "accuracy"]])
def test_metric_names_are_checked_against_what_something_produces(metrics: list[str]) -> None:
    p = ProblemCollector()
    objs, cons = parse_targets(["accuracy:max", "bogus:min"],
                               ["step_time_ms<5", "latency_99<3", "latency_ms<2", "train_loss<1"],
                               task_metrics=metrics, problems=p)
    assert [o.metric for o in objs] == ["accuracy", "bogus"]
    assert len(cons) == 4
    text = "\n".join(p.problems)
    assert "metric 'bogus' is produced by nothing" in text
    assert "metric 'latency_99' is produced by nothing" in text
    assert len(p.problems) == 2
