"""``proftune.search(...)``: a constraint-aware, profile-gated hyperparameter search, recorded."""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import os
import pickle
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from ..exceptions import ConfigError, ProblemCollector, RunFailedError
from ..task import ClassificationTask, Task, load_task
from ..track import Store, environment, tracked_run
from ._analysis import _direction, correlations, importance, pareto_front, plot_study
from ._constraints import Constraint, Objective, parse_targets
from ._pruners import PRUNERS
from ._ray import RayOptions, pbt_plot, run_ray
from ._space import Space, load_space
from ._study import (
    ATTR,
    SAMPLERS,
    SearchSettings,
    TrialRecord,
    _counts,
    check_settings,
    open_storage,
    raise_if_too_many_failures,
    run_worker,
    trial_records,
)

__all__ = ["BACKENDS", "SearchResult", "search", "task_metrics"]

#: Where trials run: this machine's processes, or a Ray cluster (``RayOptions``).
BACKENDS = ("local", "ray")


@dataclass
class SearchResult:
    """What a search found: the best trial(s), every trial, and the analysis."""

    study: str
    run_id: int
    db: str
    objectives: list[Objective]
    constraints: list[Constraint]
    trials: list[TrialRecord]
    best: TrialRecord | None
    pareto: list[TrialRecord]
    correlations: dict[str, Any]
    importance: dict[str, Any]
    space_hash: str
    sampler: str
    pruner: str
    duration_s: float
    resumed: bool
    plots: list[str] = field(default_factory=list)
    #: Under ``backend="ray"``: scheduler, experiment folder, retries, PBT schedules.
    backend: dict[str, Any] = field(default_factory=lambda: {"backend": "local"})

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(("complete", "pruned", "infeasible", "failed", "running"), 0)
        for t in self.trials:
            out[t.state] = out.get(t.state, 0) + 1
        return out

    def compute(self) -> dict[str, float]:
        """Seconds spent training and profiling, and what went to infeasible trials."""
        return {
            "train_s": sum(t.train_s for t in self.trials),
            "gate_s": sum(t.gate_s for t in self.trials),
            "steps": float(sum(t.steps for t in self.trials)),
            "infeasible_s": sum(t.duration_s or 0.0 for t in self.trials if t.state == "infeasible"),
            "infeasible_train_s": sum(t.train_s for t in self.trials if t.state == "infeasible"),
            "trials_s": sum(t.duration_s or 0.0 for t in self.trials),
        }

    def to_dict(self) -> dict[str, Any]:
        def best_dict(t: TrialRecord | None) -> dict[str, Any] | None:
            if t is None:
                return None
            return {"number": t.number, "params": t.params, "values": t.values, "metrics": t.metrics,
                    "run_id": t.run_id}

        return {
            "study": self.study,
            "run_id": self.run_id,
            "db": self.db,
            "objectives": [o.text for o in self.objectives],
            "constraints": [c.text for c in self.constraints],
            "sampler": self.sampler,
            "pruner": self.pruner,
            "space_hash": self.space_hash,
            "resumed": self.resumed,
            "best": best_dict(self.best),
            "pareto": [best_dict(t) for t in self.pareto],
            "counts": self.counts(),
            "compute": self.compute(),
            "trials": [t.to_dict() for t in self.trials],
            "correlations": self.correlations,
            "importance": self.importance,
            "duration_s": self.duration_s,
            "plots": self.plots,
            "backend": self.backend,
        }


def task_metrics(task: Task) -> list[str] | None:
    """The metric names ``task.evaluate`` returns (None when they cannot be known)."""
    declared = getattr(task, "metrics", None)
    if isinstance(declared, (list, tuple)) and all(isinstance(m, str) for m in declared):
        return list(declared)
    evaluate = type(task).evaluate
    if evaluate is ClassificationTask.evaluate:
        return ["val_loss", "accuracy"]
    if evaluate is Task.evaluate:
        return ["val_loss"]
    try:  # the task's own evaluate: ask it once on a fresh model
        from .._device import resolve_device
        from ..train import evaluate_model

        params = dict(task.default_params)
        model = task.build_model(params)
        return sorted(evaluate_model(task, model, resolve_device("cpu"), int(params.get("batch_size", 64))))
    except Exception:
        return None


def _study_definition(space: Space, objectives: Sequence[Objective],
                      constraints: Sequence[Constraint], task_name: str) -> dict[str, Any]:
    return {
        f"{ATTR}_space": space.to_dict(),
        f"{ATTR}_space_hash": space.hash(),
        f"{ATTR}_objectives": [o.text for o in objectives],
        f"{ATTR}_constraints": [c.text for c in constraints],
        f"{ATTR}_task": task_name,
    }


def _differences(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    out = []
    s_space, w_space = stored.get(f"{ATTR}_space") or {}, wanted[f"{ATTR}_space"]
    s_params, w_params = s_space.get("params", {}), w_space.get("params", {})
    for name in sorted(set(s_params) | set(w_params)):
        if name not in w_params:
            out.append(f"param {name!r} is in the stored space but not in this one")
        elif name not in s_params:
            out.append(f"param {name!r} is new (not in the stored space)")
        elif s_params[name] != w_params[name]:
            out.append(f"param {name!r} changed: stored {s_params[name]}, now {w_params[name]}")
    for key in ("fixed", "forbid", "tiers"):
        if s_space.get(key) != w_space.get(key):
            out.append(f"{key} changed: stored {s_space.get(key)}, now {w_space.get(key)}")
    if not out and stored.get(f"{ATTR}_space_hash") != wanted[f"{ATTR}_space_hash"]:
        out.append(f"space hash changed: stored {stored.get(f'{ATTR}_space_hash')}, now "
                   f"{wanted[f'{ATTR}_space_hash']}")
    for key, label in (("objectives", "objectives"), ("constraints", "constraints"), ("task", "task")):
        s, w = stored.get(f"{ATTR}_{key}"), wanted[f"{ATTR}_{key}"]
        if s != w:
            out.append(f"{label} changed: stored {s}, now {w}")
    return out


def _worker_entry(settings: SearchSettings, worker: int, deadline: float | None, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    run_worker(settings, worker, deadline)


def search(
    task: Task | str,
    space: str | Path | Mapping[str, Any] | Space,
    *,
    objectives: Sequence[str] | None = None,
    constraints: Sequence[str] = (),
    trials: int = 20,
    timeout: float | None = None,
    sampler: str = "tpe",
    pruner: str = "none",
    epochs: int | None = None,
    max_steps: int | None = None,
    study: str | None = None,
    db: str | None = None,
    workers: int = 1,
    seed: int = 0,
    device: str = "auto",
    max_failures: int = 5,
    gate_steps: int = 3,
    coarse: str = "halton",
    grid_points: int = 5,
    plot: str | Path | None = None,
    store: Store | None = None,
    backend: str = "local",
    ray: RayOptions | None = None,
) -> SearchResult:
    """Search ``space`` for the best configuration of ``task`` under ``constraints``.

    ``objectives``: ``"accuracy:max"``-style, one (best trial) or several (Pareto front);
    default: ``accuracy:max`` when the task reports accuracy, else ``val_loss:min``.
    ``constraints``: ``"step_time_ms<50"``-style, on task or profile metrics; profile ones gate
    each trial before it trains. ``trials`` counts the study's finished trials, so running
    again with the same ``study`` continues it. ``timeout`` bounds this call (seconds).
    ``coarse``: the first pass of ``sampler="coarse-to-fine"``, ``"halton"`` or ``"grid"``
    (``grid_points`` per continuous param, also the points of ``sampler="grid"``).
    ``backend``: ``"local"`` (this machine's processes) or ``"ray"`` (Ray Tune; ``ray`` says
    where and with which scheduler: fifo, asha, pbt).
    """
    started = time.perf_counter()
    problems = ProblemCollector()
    task_obj = load_task(task)
    task_name = task_obj.name or type(task_obj).__name__
    space_obj: Space | None = None
    try:
        space_obj = load_space(space)
    except ConfigError as exc:
        problems.problems.extend(exc.problems)
    metrics = task_metrics(task_obj)
    if objectives is None or len(objectives) == 0:
        objectives = ["accuracy:max"] if metrics is None or "accuracy" in metrics else ["val_loss:min"]
    objs, cons = parse_targets(objectives, constraints, task_metrics=metrics, problems=problems)
    if sampler not in SAMPLERS:
        problems.add(f"--sampler {sampler!r} is unknown; valid: {', '.join(SAMPLERS)}.")
    if pruner not in PRUNERS:
        problems.add(f"--pruner {pruner!r} is unknown; valid: {', '.join(PRUNERS)}.")
    if backend not in BACKENDS:
        problems.add(f"--backend {backend!r} is unknown; valid: {', '.join(BACKENDS)}.")
    if workers > 1 and not isinstance(task, str):
        try:
            pickle.dumps(task_obj)
        except Exception:
            problems.add("workers > 1 needs a task that other processes can load: give its spec "
                         "('file.py:Class', 'pkg.mod:Class' or a built-in name).")
    if space_obj is not None:
        settings = SearchSettings(
            task=task if isinstance(task, str) else task_obj, space=space_obj, objectives=objs,
            constraints=cons, trials=trials, study=study or "", db="", sampler=sampler, pruner=pruner,
            epochs=epochs, max_steps=max_steps, timeout=timeout, seed=seed, device=device,
            max_failures=max_failures, gate_steps=gate_steps, workers=workers, task_name=task_name,
            coarse=coarse, grid_points=grid_points)
        check_settings(settings, problems)
    problems.raise_if_any(header="tune: the search is not well-formed, found the following errors:")
    assert space_obj is not None
    if epochs is None and max_steps is None:
        settings.epochs = epochs = task_obj.default_epochs

    store = store or Store(db)
    settings.db = store.url
    name = study or f"tune-{task_name}-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{os.getpid()}"
    settings.study = name
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = open_storage(store.url)
    wanted = _study_definition(space_obj, objs, cons, task_name)
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        study_id = None
    resumed = study_id is not None
    if study_id is not None:
        stored = storage.get_study_user_attrs(study_id)
        diffs = _differences(stored, wanted)
        if diffs:
            raise ConfigError(diffs, header=(
                f"study {name!r} in {store.url} was created with a different space or targets; "
                "it was left unchanged. Use another --study name, or the original space:"))

    config = {"study": name, "space": space_obj.to_dict(), "space_hash": space_obj.hash(),
              "objectives": [o.text for o in objs], "constraints": [c.text for c in cons],
              "trials": trials, "timeout": timeout, "sampler": sampler, "pruner": pruner,
              "epochs": epochs, "max_steps": max_steps, "workers": workers, "seed": seed,
              "device": device, "max_failures": max_failures, "resumed": resumed,
              "params": dict(space_obj.fixed)}
    with tracked_run("tune", task_obj, config=config, device=None, store=store, study=name) as run:
        record = store.get_run(run.id)
        settings.tune_run_id = run.id
        settings.data_fingerprint = record.data_fingerprint
        settings.env = environment(None)
        created = optuna.create_study(study_name=name, storage=storage, load_if_exists=True,
                                      directions=[_direction(o) for o in objs])
        if not resumed:
            for key, value in wanted.items():
                created.set_user_attr(key, value)
        deadline = time.time() + timeout if timeout else None
        ray_out: dict[str, Any] | None = None
        if backend == "ray":
            ray_out = run_ray(settings, ray or RayOptions(workers=workers), storage=storage,
                              store=store, deadline=deadline,
                              finished=_counts(created)["finished"])
        elif workers == 1:
            run_worker(settings, 0, deadline, storage=storage)
        else:
            _run_processes(settings, workers, deadline)
        loaded = optuna.load_study(study_name=name, storage=storage)
        raise_if_too_many_failures(loaded, max_failures)
        records = trial_records(loaded)
        front = pareto_front(records, objs)
        corr = correlations(records, space_obj, objs)
        imp = importance(loaded, records, objs, seed=seed)
        result = SearchResult(
            study=name, run_id=run.id, db=store.url, objectives=objs, constraints=cons,
            trials=records, best=front[0] if front else None, pareto=front, correlations=corr,
            importance=imp, space_hash=space_obj.hash(), sampler=sampler, pruner=pruner,
            duration_s=time.perf_counter() - started, resumed=resumed)
        if ray_out is not None:
            result.backend = ray_out
        if plot is not None:
            result.plots = plot_study(records, objs, corr, imp, front, plot)
            if ray_out and ray_out.get("schedule") and ray_out.get("scheduler") == "pbt":
                result.plots.append(str(pbt_plot(ray_out["schedule"], Path(plot) / "pbt_schedule.png")))
        summary = result.to_dict()
        run.set(metrics=dict(result.best.metrics) if result.best else {},
                result={k: summary[k] for k in ("best", "pareto", "counts", "compute",
                                                 "correlations", "importance")},
                artifacts={"plots": result.plots})
    return result


def _run_processes(settings: SearchSettings, workers: int, deadline: float | None) -> None:
    """``workers`` processes on this machine share the study through the database."""
    ctx = mp.get_context("spawn")
    threads = max(1, (os.cpu_count() or 1) // workers)
    procs = [ctx.Process(target=_worker_entry, args=(settings, i, deadline, threads), daemon=False)
             for i in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise RunFailedError(f"search workers ended with errors: {bad} (worker, exit code); the "
                             "finished trials are in the study, run the same command to continue.")
