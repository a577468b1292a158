from __future__ import annotations

from typing import ClassVar

import pytest

from proftune import metrics
from proftune.exceptions import ConfigError


def test_directions_of_known_metrics() -> None:
    assert metrics.direction("accuracy") == "max"
    assert metrics.direction("mse") == "min"
    assert metrics.direction("throughput") == "max"
    assert metrics.direction("latency_ms") == "min"
    assert metrics.better("accuracy", 0.9, 0.8)
    assert metrics.better("mse", 0.1, 0.2)


def test_unknown_metric_names_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"known metrics: .*accuracy"):
        metrics.get_metric("acuracy")


def test_task_declared_metric() -> None:
    class T:
        metric_directions: ClassVar[dict[str, str]] = {"bleu_4": "max", "wer": "minimize"}

    assert metrics.direction("bleu_4", task=T()) == "max"
    assert metrics.direction("wer", task=T()) == "min"


def test_stages_partition_profile_metrics() -> None:
    assert "params" in metrics.produced_by("static")
    assert "step_time_ms" in metrics.produced_by("step")
    assert "latency_ms" in metrics.produced_by("inference")
    with pytest.raises(ConfigError, match="valid: static"):
        metrics.produced_by("nope")


def test_resolve_direction() -> None:
    assert metrics.resolve_direction("accuracy", None) == "max"
    assert metrics.resolve_direction("accuracy", "minimise") == "min"
    with pytest.raises(ConfigError, match="valid: max, min"):
        metrics.resolve_direction("accuracy", "up")


def test_default_objective() -> None:
    assert metrics.default_objective(["val_loss", "accuracy"]) == "accuracy:max"
    assert metrics.default_objective(["val_loss", "f1"]) == "val_loss:min"
    assert metrics.default_objective(None) == "accuracy:max"  # unknown before training


def test_split_objective_never_guesses() -> None:
    assert metrics.split_objective("accuracy") == ("accuracy", "max")
    assert metrics.split_objective(" val_loss : min ") == ("val_loss", "min")
    assert metrics.split_objective("wobble:max") == ("wobble", "max")

    class Declares:
        metric_directions: ClassVar[dict[str, str]] = {"wobble": "max"}

    assert metrics.split_objective("wobble", task=Declares()) == ("wobble", "max")
    with pytest.raises(ConfigError, match="unknown"):
        metrics.split_objective("wobble")


def test_the_default_objective_is_spelled_only_in_metrics() -> None:
    """search, optimize, diagnose and report ask metrics.default_objective; none writes its own."""
    import ast
    from pathlib import Path

    src = Path(metrics.__file__).parent
    spelled = []
    for path in src.rglob("*.py"):
        if path.name == "metrics.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ("accuracy:max", "val_loss:min"):
                spelled.append(f"{path.relative_to(src)}:{node.lineno}")
            if (isinstance(node, ast.Tuple) and len(node.elts) == 2
                    and [getattr(e, "value", None) for e in node.elts] == ["accuracy", "max"]):
                spelled.append(f"{path.relative_to(src)}:{node.lineno}")
    assert spelled == []
