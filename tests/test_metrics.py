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
