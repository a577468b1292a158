"""Objectives and constraints: parsing, units, violations, metric names checked."""

from __future__ import annotations

import pytest

from proftune.exceptions import ProblemCollector
from proftune.search._constraints import parse_constraint, parse_objective, parse_targets


def test_constraint_parsing_units_and_violation_sign() -> None:
    p = ProblemCollector()
    c = parse_constraint("step_time_ms<50", p)
    assert c is not None and (c.metric, c.op, c.threshold) == ("step_time_ms", "<", 50.0)
    assert c.violation(40.0) < 0 < c.violation(60.0)
    assert c.violation(50.0) > 0  # strict: on the limit is outside
    assert c.violation(float("nan")) > 0
    assert "step_time_ms=60 >= 50" in c.reason(60.0)
    mem = parse_constraint("peak_memory_bytes<=2GiB", p)
    assert mem is not None and mem.threshold == 2 * 2**30 and mem.violation(2 * 2**30) == 0.0
    acc = parse_constraint("accuracy>=0.9", p)
    assert acc is not None and acc.violation(0.95) < 0 < acc.violation(0.8) and not acc.is_profile
    assert not p


def test_malformed_constraints_and_objectives_are_problems() -> None:
    p = ProblemCollector()
    assert parse_constraint("step_time_ms << 50", p) is None
    assert parse_constraint("step_time_ms<50parsecs", p) is None
    assert parse_objective("accuracy:up", p) is None
    assert len(p.problems) == 3


def test_default_directions() -> None:
    p = ProblemCollector()
    assert parse_objective("accuracy", p).direction == "maximize"
    assert parse_objective("val_loss", p).direction == "minimize"
    assert parse_objective("step_time_ms", p).direction == "minimize"
    assert parse_objective("throughput", p).direction == "maximize"
    assert parse_objective("f1_score", p).direction == "maximize"


@pytest.mark.parametrize("metrics", [["val_loss", "accuracy"]])
def test_metric_names_are_checked_against_task_and_profile_metrics(metrics: list[str]) -> None:
    p = ProblemCollector()
    objs, cons = parse_targets(["accuracy:max", "bogus:min"], ["step_time_ms<5", "latency_99<3"],
                               task_metrics=metrics, problems=p)
    assert [o.metric for o in objs] == ["accuracy", "bogus"]
    assert len(cons) == 2
    text = "\n".join(p.problems)
    assert "metric 'bogus' does not exist" in text and "metric 'latency_99' does not exist" in text
    assert len(p.problems) == 2
