"""The race's first seed from trainings already made: the baseline's of the defaults, and the
search's of its best where that trial ran the task's own epochs at the same seed and its model
was kept. Neither is trained again: at a few trainings of budget, the one or two trainings saved
are a third of what the search gets.

The search's training of its best is the best of its draws on the same validation data, so its
first pair with the defaults is inflated by that selection; the race's decision rules (a paired
bound against the seeds' known noise) are the guard, and further rounds at fresh seeds dilute it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

import torch

from .._jsonsafe import finite_float
from ..search import TrialRecord
from ..train import TrainParams, evaluate_model
from ._context import StageContext
from ._final import MAX_CANDIDATES, Arm, ArmRun, FinalOutcome
from ._records import BaselineOutputs, SearchStageOutputs
from ._search_records import KeptRun
from ._stage_measures import params_key

__all__ = ["MODELS_DIR", "baseline_first", "cut_short", "kept_runs", "search_first", "search_proposals",
           "short_finalist"]

#: The folder (in the loop's output folder) where the search keeps the models of its leading trials.
MODELS_DIR = "search_models"


def kept_runs(trials: Sequence[TrialRecord], *, out: Path, seed: int, epochs: int, metric: str) -> list[KeptRun]:
    """The complete trials at ``epochs`` (the task's own) and ``seed`` (the race's first) whose model
    the search kept under ``out / MODELS_DIR``."""
    kept = []
    for t in trials:
        path = out / MODELS_DIR / f"trial-{t.number}.pt"
        val = finite_float(t.metrics.get(metric))
        if t.state != "complete" or t.repeat or t.seed != seed or t.epochs < epochs or val is None:
            continue
        if path.is_file():
            kept.append(KeptRun(trial=t.number, run_id=t.run_id, seed=seed, val=val, epochs=t.epochs,
                                duration_s=float(t.train_s or t.duration_s or 0.0),
                                metrics={k: float(v) for k, v in t.metrics.items() if isinstance(v, (int, float))},
                                model=str(path.relative_to(out)), params=dict(t.params)))
    return kept


def _run(loop: StageContext, params: Mapping[str, object], path: Path, *, seed: int, run_id: int | None,
         metrics: dict[str, float], epochs: int, duration_s: float) -> ArmRun:
    """A finished training of ``params`` as a run of the race, its held-out figure measured now."""
    test: dict[str, float] = {}
    if loop.task.test_data(1) is not None:
        model = loop.task.build_model(dict(params)).to(loop.dev)
        model.load_state_dict(torch.load(path, map_location=loop.dev, weights_only=True))
        test = evaluate_model(loop.task, model, loop.dev, int(cast(int, params.get("batch_size", 32))), split="test")
    return ArmRun(seed=seed, run_id=run_id, val=finite_float(metrics.get(loop.v.metric)),
                  test=finite_float(test.get(loop.v.metric)), epochs=epochs, duration_s=duration_s, cut=False,
                  val_metrics=dict(metrics), test_metrics=test)


def baseline_first(loop: StageContext) -> tuple[ArmRun, Path] | None:
    """The baseline's training of the defaults as the race's first run of them (their own epochs
    to the end, its model kept): one training the race does not pay again. None: it was cut."""
    if not loop.planner.baseline_reusable():
        return None
    base = loop.state.record(BaselineOutputs)
    assert base.model is not None  # baseline_reusable checked it
    path = loop.out / base.model
    d = base.defaults
    return _run(loop, dict(loop.defaults), path, seed=int(loop.cfg.seed), run_id=d.run_id, metrics=dict(d.metrics),
                epochs=int(d.epochs or 0), duration_s=float(d.duration_s or 0.0)), path


def search_first(loop: StageContext, arm: Arm, *, seed: int | None) -> tuple[ArmRun, Path] | None:
    """The search's own training of ``arm``'s configuration at the race's first ``seed`` (the
    baseline's) and the arm's epochs (the task's own where it names none), where its model was kept:
    the arm's first run, not trained again. None: no such training (trials at fewer epochs, another
    seed, not kept)."""
    if seed is None:
        return None
    key = params_key(arm.params)
    srch = loop.state.record(SearchStageOutputs)
    for k in srch.kept:
        path = loop.out / k.model
        if k.seed != seed or k.epochs < (arm.epochs or loop.task.default_epochs) or not path.is_file():
            continue
        if params_key({**arm.params, **k.params}) != key:
            continue
        return _run(loop, dict(arm.params), path, seed=seed, run_id=k.run_id, metrics=dict(k.metrics),
                    epochs=k.epochs, duration_s=k.duration_s), path
    return None


def short_finalist(loop: StageContext, best: Arm, trial_epochs: int, hard_end: float) -> Arm | None:
    """The search's best at the trials' fewer epochs, where one training of it at the task's own does
    not fit before ``hard_end`` (``time.monotonic()``) and the search kept its model at the baseline's
    seed: its first run costs nothing. A plain loop adopts its best as it trained it; the race judges
    it first (its figure less the best-of-the-draws selection, against the seeds' noise). None: trials
    at the task's own epochs, time for a training of it there, or no such model."""
    epochs = loop.task.default_epochs
    if trial_epochs >= epochs or hard_end - time.monotonic() >= 1.1 * best.epoch_s * epochs:
        return None
    return _kept_short(loop, best, trial_epochs)


def _kept_short(loop: StageContext, best: Arm, trial_epochs: int) -> Arm | None:
    """``best`` at the trials' ``trial_epochs``, where the search kept its model at the baseline's seed."""
    short = dataclasses.replace(best, name=f"{best.name} at {trial_epochs} epochs", epochs=trial_epochs)
    return short if search_first(loop, short, seed=int(loop.cfg.seed)) is not None else None


def cut_short(loop: StageContext, outcome: FinalOutcome, best: Arm | None, trial_epochs: int) -> Arm | None:
    """The search's ``best`` at the trials' fewer epochs, where the race kept the defaults only because
    every run of that best at the task's own epochs was cut by the clock (a busy machine: the run
    measured to fit did not) and the search kept its model at the baseline's seed: it races the
    defaults in its place at no training's cost, judged as its own draw (its figure against the
    seeds' noise, and its lead in the search beyond one figure's noise). None: the race judged the
    best, or no such model. (A cut race kept a lead of 0.85 against 0.47 on validation as the defaults.)"""
    if outcome.decision != "defaults" or best is None or trial_epochs >= loop.task.default_epochs:
        return None
    runs: Sequence[ArmRun] = next((a.runs for a in outcome.arms if a.name == best.name), [])
    if not runs or any(r.val is not None and not r.cut for r in runs):
        return None
    return _kept_short(loop, best, trial_epochs)


def search_proposals(loop: StageContext, srch: SearchStageOutputs, trial_epochs: int, epoch_s: float) -> list[Arm]:
    """The search's groups best first, other than the defaults, as the race's arms at the task's own
    epochs (``MAX_CANDIDATES`` at most); each configuration validated here, once."""
    epochs = loop.task.default_epochs
    defaults_key = params_key(loop.defaults)
    fixed = srch.fixed()
    proposals: list[Arm] = []
    for g in srch.top:
        train = TrainParams({**loop.defaults, **fixed, **g.params})
        if params_key(params := train.params) == defaults_key or len(proposals) >= MAX_CANDIDATES:
            continue
        proposals.append(Arm(
            name=f"search #{len(proposals) + 1}", params=params, train=train,
            source=(f"search trials {g.trials} ({', '.join(sorted(set(g.arms)))}"
                    + (f", at {trial_epochs} of {epochs} epochs" if trial_epochs < epochs else "") + ")"),
            search_mean=g.mean, search_std=g.std, search_n=g.n,
            epoch_s=max(g.trial_s / max(trial_epochs, 1), epoch_s * 0.25), epochs=epochs))
    return proposals
