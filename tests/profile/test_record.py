"""The Profile record: JSON round trip, versioning, comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proftune.exceptions import ConfigError
from proftune.profile import (
    SCHEMA_VERSION,
    LayerProfile,
    MemoryProfile,
    ParamCounts,
    Profile,
    StepProfile,
    compare_profiles,
)


def _profile(scale: int = 1) -> Profile:
    return Profile(
        task="t", batch_size=8, steps=3, params=ParamCounts(100 * scale, 90 * scale), macs=1000 * scale,
        flops=2000 * scale,
        layers=(LayerProfile("fc", "Linear", params=100 * scale, macs=1000 * scale, flops=2000 * scale,
                             forward_ms=1.5, backward_ms=3.0),),
        memory=MemoryProfile(params_bytes=400 * scale, peak_bytes=4000 * scale),
        step=StepProfile(time_ms=10.0 * scale, throughput=800.0 / scale),
    )


def test_round_trip(tmp_path: Path) -> None:
    p = _profile()
    path = p.save(tmp_path / "p.json")
    q = Profile.load(path)
    assert q == p
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["params"]["total"] == 100
    assert data["layers"][0]["name"] == "fc"


def test_frozen() -> None:
    with pytest.raises(AttributeError):
        _profile().macs = 3  # type: ignore[misc]


def test_metrics_names() -> None:
    m = _profile().metrics()
    assert m["step_time_ms"] == 10.0
    assert m["peak_memory_bytes"] == 4000
    assert m["params"] == 100


def test_load_rejects_foreign_json(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="schema_version"):
        Profile.load(bad)
    newer = tmp_path / "y.json"
    newer.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(ConfigError, match="newer"):
        Profile.load(newer)


def test_compare() -> None:
    diff = compare_profiles(_profile(2), _profile(1))
    assert diff["totals"]["params"]["ratio"] == pytest.approx(0.5)
    assert diff["layers"][0]["macs"]["delta"] == -1000
