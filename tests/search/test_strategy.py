"""Strategy statements on a synthetic study match the rules that generated it."""

from __future__ import annotations

import random

from proftune.exceptions import ProblemCollector
from proftune.search import Objective, TrialRecord, load_space, parse_constraint, strategy

SPACE = load_space({"params": {
    "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
    "width": {"type": "int", "low": 8, "high": 64, "step": 8},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5},
    "momentum": {"type": "float", "low": 0.0, "high": 1.0},
}})
OBJ = [Objective("accuracy", "maximize")]


def _study(n: int, seed: int = 0) -> list[TrialRecord]:
    """accuracy rises with log lr up to its upper bound and peaks at momentum 0.5; dropout does
    nothing; width costs step time (8 ms per unit of 8) and breaks step_time_ms<40 above 32."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lr = 10 ** rng.uniform(-4, -1)
        width = rng.choice(range(8, 72, 8))
        dropout, momentum = rng.uniform(0, 0.5), rng.uniform(0, 1)
        step_ms = width + rng.uniform(-2, 2)
        params = {"lr": lr, "width": width, "dropout": dropout, "momentum": momentum}
        if step_ms >= 40:
            out.append(TrialRecord(i, "infeasible", params, None, {"step_time_ms": step_ms}, {}, "slow",
                                   1.0, gated=True))
            continue
        acc = 0.5 + 0.1 * (lr ** 0.5) * 10 - 0.4 * (momentum - 0.5) ** 2 + rng.gauss(0, 0.005)
        out.append(TrialRecord(i, "complete", params, [acc], {"accuracy": acc, "step_time_ms": step_ms},
                               {}, None, 1.0))
    return out


def _by_subject(records: list[TrialRecord]) -> dict[str, str]:
    slow = parse_constraint("step_time_ms<40", ProblemCollector())
    assert slow is not None
    return {st.subject: st.action for st in strategy(records, SPACE, OBJ, [slow], seed=0)}


def test_statements_match_the_generating_rules() -> None:
    actions = _by_subject(_study(100))
    assert actions["step_time_ms<40"] == "driven by"
    assert actions["width"] == "restrict"
    assert actions["lr"] == "widen"
    assert actions["dropout"] == "fix"
    assert actions["momentum"] == "keep"


def test_too_few_trials_say_so() -> None:
    actions = _by_subject(_study(6))
    assert actions["step_time_ms<40"] == "not enough trials"
    assert {actions[p] for p in ("lr", "dropout", "momentum", "width")} == {"not enough trials"}
