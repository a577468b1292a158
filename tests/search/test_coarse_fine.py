"""Coarse-to-fine: Halton over the whole space, then samples near the best few (no training here)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
import torch

from proftune.search import CoarseToFineSampler


def test_fine_pass_samples_near_the_best_coarse_trials() -> None:
    sampler = CoarseToFineSampler(n_coarse=8, top_k=2, width=0.05, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", 0.0, 10.0)
        n = trial.suggest_int("n", 1, 64, log=True)
        c = trial.suggest_categorical("c", ["a", "b", "c"])
        return -((x - 7.3) ** 2) - (0 if c == "b" else 5) - abs(n - 16) / 16

    study.optimize(objective, n_trials=24)
    coarse, fine = study.trials[:8], study.trials[8:]
    best_coarse = sorted(coarse, key=lambda t: -(t.value or 0))[:2]
    centers = [t.params["x"] for t in best_coarse]
    dist = [min(abs(t.params["x"] - c) for c in centers) for t in fine]
    spread = statistics.pstdev(t.params["x"] for t in coarse)
    assert statistics.median(dist) < 0.25 * spread  # the fine pass stays around the best few
    for t in fine:  # every value stays inside its distribution (log int on the grid of ints)
        assert 0.0 <= t.params["x"] <= 10.0
        assert 1 <= t.params["n"] <= 64
        assert isinstance(t.params["n"], int)
    best_c = {t.params["c"] for t in best_coarse}
    assert sum(t.params["c"] in best_c for t in fine) >= 0.6 * len(fine)
    assert max(t.value or -1e9 for t in fine) >= max(t.value or -1e9 for t in coarse)


def test_timeout_stops_starting_trials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's clock is the test's: each trial takes one second of it, whatever the machine."""
    import proftune
    from proftune.examples._wine import WineMLP
    from proftune.search import _api, _study

    now = [0.0]

    class OneSecondTrials(WineMLP):
        def build_model(self, params: dict[str, Any]) -> torch.nn.Module:
            now[0] += 1.0
            return super().build_model(params)

    clock = SimpleNamespace(time=lambda: now[0], perf_counter=time.perf_counter)
    monkeypatch.setattr(_api, "time", clock)  # where the deadline is set
    monkeypatch.setattr(_study, "time", clock)  # where it is checked, before each trial
    space = {"params": {"hidden": {"type": "int", "low": 4, "high": 8}}}
    result = proftune.search(OneSecondTrials(), space, trials=50, max_steps=1, timeout=3.0,
                             db=f"sqlite:///{tmp_path / 'p.db'}", study="t")
    # trials start at 0, 1 and 2 s; at 3 s the timeout has passed: no fourth one
    assert len(result.trials) == 3
    assert now[0] == 3.0
    assert result.stopped == "timeout"
    assert all(t.state == "complete" for t in result.trials)


def test_grid_coarse_pass_then_fine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import proftune

    space = {"params": {"hidden": {"type": "int", "low": 4, "high": 16, "step": 4},
                        "lr": {"type": "float", "low": 1e-3, "high": 1e-2, "log": True}}}
    result = proftune.search("wine-mlp", space, trials=6, max_steps=2, sampler="coarse-to-fine",
                             coarse="grid", grid_points=2, db=f"sqlite:///{tmp_path / 'p.db'}", study="g")
    assert result.counts()["complete"] == 6
    coarse = result.trials[:3]  # n_coarse = trials // 2 = 3 of the 4*2 grid points
    for t in coarse:
        assert t.params["hidden"] in (4, 8, 12, 16)
        assert min(abs(t.params["lr"] - v) for v in (1e-3, 1e-2)) < 1e-12  # on the grid
