"""Durations and a metric's limit in its own unit: one parser for every command."""

from __future__ import annotations

import pytest

from proftune._units import parse_duration, parse_memory, parse_quantity
from proftune.exceptions import ConfigError


@pytest.mark.parametrize(("text", "seconds"), [
    (90, 90.0), ("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("5min", 300.0), ("1h", 3600.0),
    ("250ms", 0.25), ("1.5 min", 90.0),
])
def test_parse_duration(text: str | int, seconds: float) -> None:
    assert parse_duration(text, name="timeout") == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["5 parsecs", "-3s", "fast", True])
def test_parse_duration_rejects_names_the_parameter(bad: object) -> None:
    with pytest.raises(ConfigError, match="timeout"):
        parse_duration(bad, name="timeout")  # type: ignore[arg-type]


def test_parse_quantity_converts_to_the_metrics_unit() -> None:
    assert parse_quantity("1s", unit="ms", name="x") == 1000.0
    assert parse_quantity("2GiB", unit="bytes", name="x") == 2 * 2**30
    assert parse_quantity("2GiB", unit="bytes", name="x") == parse_memory("2GiB")
    assert parse_quantity("40", unit="ms", name="x") == 40.0
    assert parse_quantity("1.5k", unit="samples/s", name="x") == 1500.0
    with pytest.raises(ConfigError, match=r"not a unit of time; valid: ms, s, min"):
        parse_quantity("2GiB", unit="ms", name="x")
    with pytest.raises(ConfigError, match=r"not a unit of memory; valid: B, kB"):
        parse_quantity("2s", unit="bytes", name="x")
