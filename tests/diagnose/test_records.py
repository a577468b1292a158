"""The records of diagnose and bandit read back from their JSON: round trips, NaN, renamed fields,
versions (no training: the records are built by hand; the producers' runs are in
tests/report/test_producer_pages.py)."""

from __future__ import annotations

import json
import math

import pytest

from proftune._jsonsafe import json_dumps
from proftune.diagnose import (
    ArmResult,
    BanditPull,
    BanditResult,
    DiagnoseResult,
    Finding,
    RangeTest,
)
from proftune.exceptions import ConfigError


def _json(d: object) -> dict:
    return json.loads(json_dumps(d))


def _finding() -> Finding:
    child = Finding("nan_inf", "error", "loss became NaN at step 9", "lower the lr", evidence={"value": "nan"},
                    confidence=0.45, step=9, explained_by="exploding_gradients", why="explained by ...")
    return Finding("exploding_gradients", "error", "grad norm x40 in 3 steps", "clip gradients",
                   evidence={"ratio": 40.0}, confidence=0.9, step=6, layer="fc1", consequences=(child,),
                   why="ranked first")


def test_a_finding_round_trips_with_its_consequences() -> None:
    f = _finding()
    again = Finding.from_dict(_json(f.to_dict()))
    assert again == f
    assert again.consequences[0].step == 9
    assert "step" not in again.evidence  # the step lives in the field, the JSON keeps it in evidence
    with pytest.raises(ConfigError, match="no field severity"):
        Finding.from_dict({k: v for k, v in f.to_dict().items() if k != "severity"})


def test_a_range_test_keeps_its_sweep_and_its_nan() -> None:
    t = RangeTest(lrs=[1e-4, 1e-3, 1e-2], losses=[2.3, math.nan, 1.9], best_lr=1e-2, start_loss=2.3,
                  min_loss=1.9, improved=True, steps=3)
    again = RangeTest.from_dict(_json(t.to_dict()))
    assert again.lrs == t.lrs
    assert math.isnan(again.losses[1])
    assert math.isnan(RangeTest.from_dict(_json(RangeTest().to_dict())).best_lr)
    assert set(t.summary()) == set(t.to_dict()) - {"lrs", "losses"}


def test_a_diagnosis_round_trips_and_refuses_a_newer_version() -> None:
    d = DiagnoseResult(run_id=3, task="digits-mlp", findings=[_finding()], metrics={"accuracy": 0.5}, steps=40,
                       epochs=1, stop_reason="max_steps", duration_s=1.5, params={"lr": 5.0},
                       lr_test=RangeTest(lrs=[1e-3], losses=[2.0], best_lr=1e-3, steps=1))
    stored = _json(d.to_dict())
    assert stored["healthy"] is False
    assert DiagnoseResult.from_dict(stored) == d
    with pytest.raises(ConfigError, match="newer"):
        DiagnoseResult.from_dict({**stored, "schema_version": 2})
    with pytest.raises(ConfigError, match="a version is an integer"):
        DiagnoseResult.from_dict({**stored, "schema_version": "1"})
    with pytest.raises(ConfigError, match="must be a JSON object"):
        DiagnoseResult.from_dict([stored])  # type: ignore[arg-type]


def test_a_bandit_session_round_trips_with_its_metric_named_pulls() -> None:
    b = BanditResult(run_id=1, name="k", policy="ucb", metric="mse", mode="min",
                     pulls=[BanditPull(round=1, arm="a", value=0.3, run_id=2), BanditPull(round=2, arm="b", value=None,
                                                                                     run_id=3)],
                     arms=[ArmResult(arm="a", pulls=1, mean=0.3, std=None, params={"lr": 0.1}),
                           ArmResult(arm="b", pulls=1, mean=None, std=None)],
                     best="a", regret=[0.0, 0.1], total_pulls=2, uniform_regret=[0.05, 0.1])
    stored = _json(b.to_dict())
    assert stored["pulls"][0] == {"round": 1, "arm": "a", "mse": 0.3, "run_id": 2}
    assert stored["bandit"] == "k"
    assert BanditResult.from_dict(stored) == b
    assert ArmResult.from_dict({**stored["arms"][0], "std": "nan"}).std is None  # runs recorded NaN as text
