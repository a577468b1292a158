"""optuna-dashboard opens the studies `proftune tune` writes: trials, states, profile metrics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from proftune.search import search

from ._servers import free_port, get_json, serving

pytest.importorskip("optuna_dashboard", reason="the dashboard extra: pip install -e '.[dashboard]'")


@pytest.mark.skipif(shutil.which("optuna-dashboard") is None, reason="no optuna-dashboard command on PATH")
def test_dashboard_reads_the_study_with_profile_metrics(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'tune.db'}"
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  hidden: {type: categorical, choices: [16, 32]}\n"
                     "  lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n")
    result = search("digits-mlp", str(space), constraints=["step_time_ms<100000"], trials=2, epochs=1,
                    study="dash", db=db, sampler="random", device="cpu")
    assert len(result.trials) == 2
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with serving([shutil.which("optuna-dashboard") or "optuna-dashboard", db, "--host", "127.0.0.1",
                  "--port", str(port)], f"{base}/api/studies", log=tmp_path / "dashboard.log", wait_s=120):
        studies = get_json(f"{base}/api/studies")["study_summaries"]
        study = next(s for s in studies if s["study_name"] == "dash")
        detail = get_json(f"{base}/api/studies/{study['study_id']}")
    trials = detail["trials"]
    assert len(trials) == 2
    assert {t["state"] for t in trials} <= {"Complete", "Pruned", "Fail"}
    for t in trials:
        attrs = {a["key"]: a["value"] for a in t["user_attrs"]}
        record = json.loads(attrs["proftune"])  # the dashboard shows the attribute as JSON text
        assert record["metrics"]["step_time_ms"] > 0
        assert record["state"] == t["state"].lower()
        assert record["params"]["hidden"] in (16, 32)
    assert {p["name"] for p in detail["union_search_space"]} == {"hidden", "lr"}
