"""`proftune tune obj.py:fn`: a plain Python objective from a file, searched as `proftune.search`
searches a callable (its trials, the selection by mean, the refining end of the budget)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from proftune.cli import app

OBJECTIVE = '''
import random

CALLS = []  # the file is imported once: one list of every call


def noisy(params, seed):
    CALLS.append(seed)
    rng = random.Random(seed * 1_000_003 + int(params["x"] * 1e6))
    return {"loss": (params["x"] - 0.3) ** 2 + rng.gauss(0.0, 0.05), "calls": len(CALLS)}
'''


def test_tune_searches_a_function_in_a_file(tmp_path: Path) -> None:
    obj = tmp_path / "obj.py"
    obj.write_text(OBJECTIVE)
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  x: {type: float, low: -1.0, high: 1.0}\n")
    res = CliRunner().invoke(app, ["tune", f"{obj}:noisy", "--space", str(space), "--trials", "60",
                                   "--objective", "loss:min", "--json", "--db", f"sqlite:///{tmp_path / 'r.db'}"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert len(d["trials"]) == 60
    assert max(t["metrics"]["calls"] for t in d["trials"]) == 60  # one import, one call per trial
    sel = d["selection"]
    assert sel["evaluations"] == 60
    assert sel["repeats"] > 0
    assert sel["neighbours"] > 0
    assert sum(1 for t in d["trials"] if t["sampler"] == "neighbour") == sel["neighbours"]
    assert abs(sel["params"]["x"] - 0.3) < 0.3
    missing = CliRunner().invoke(app, ["tune", f"{obj}:absent", "--space", str(space), "--trials", "2",
                                       "--db", f"sqlite:///{tmp_path / 'r.db'}"])
    assert missing.exit_code != 0
    assert "absent" in missing.output
    unknown = CliRunner().invoke(app, ["tune", "no-such-task", "--space", str(space), "--trials", "2",
                                       "--db", f"sqlite:///{tmp_path / 'r.db'}"])
    assert unknown.exit_code == 2
    assert "Built-in tasks" in unknown.output  # both forms named: a Task's and a function's
    assert "'obj.py:fn'" in unknown.output
