"""What ``proftune optimize`` is asked to do, validated at the edge (one error lists every problem)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._units import parse_duration, parse_memory
from ..exceptions import ConfigError, ProblemCollector
from ..metrics import default_objective, get_metric
from ..search import load_space, parse_constraint, parse_objective, task_metrics
from ..task import Task

if TYPE_CHECKING:
    from ..track import RunRecord
    from ._state import StateFile

__all__ = ["OPTIMIZE_GOALS", "OptimizeConfig", "Validated", "validate"]

OPTIMIZE_GOALS = ("latency", "size", "none")


@dataclass
class OptimizeConfig:
    """The options of ``proftune optimize`` (see the README's optimize section)."""

    budget: str | float = "20m"
    memory_budget: str | int | None = None
    constraints: tuple[str, ...] = ()
    objective: str | None = None
    space: str | None = None
    max_accuracy_drop: float = 0.01
    goal: str = "latency"
    seeds: int = 3
    out: str | None = None
    study: str | None = None
    resume: bool = False
    ignore_findings: bool = False
    device: str = "auto"
    db: str | None = None
    seed: int = 0
    #: Auto-stop: the search ends when its best improved by less than ``min_delta`` (metric
    #: units) over the last ``max(patience, half the complete trials)`` complete trials.
    min_delta: float = 1e-3
    patience: int = 8
    max_trials: int = 1000
    #: Trials failing for one cause before their region is paused (yellow flag).
    flag_min: int = 3
    extra: dict[str, Any] = field(default_factory=dict)
    #: Called in this process with each search trial's Run as it ends (``search(on_trial=)``):
    #: a live sink such as ``proftune.report.WandbTrialLogger``. Not recorded with the options.
    on_trial: Callable[[RunRecord], object] | None = None


@dataclass
class Validated:
    """The config with every value parsed: seconds, bytes, metric and direction, the out folder."""

    cfg: OptimizeConfig
    budget_s: float
    memory_bytes: int | None
    metric: str
    maximize: bool
    objective: str
    out: Path
    stored: StateFile | None


def _with(cfg: OptimizeConfig | None, overrides: dict[str, Any]) -> OptimizeConfig:
    base = cfg or OptimizeConfig()
    names = {f.name for f in dataclasses.fields(OptimizeConfig)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"optimize() got unknown options {unknown}; valid: {', '.join(sorted(names))}.")
    if "constraints" in overrides and overrides["constraints"] is not None:
        overrides["constraints"] = tuple(overrides["constraints"])
    return dataclasses.replace(base, **overrides)


def validate(task: Task, cfg: OptimizeConfig | None, overrides: dict[str, Any]) -> Validated:  # noqa: C901
    """Parse and check every option; raise one :class:`ConfigError` naming every problem.

    One flat check per option, all collected into one error: the branches are the options.
    """
    from ._state import check_out_dir

    cfg = _with(cfg, overrides)
    problems = ProblemCollector()
    name = task.name or type(task).__name__
    budget_s = 0.0
    try:
        budget_s = parse_duration(cfg.budget, name="budget")
    except ConfigError as exc:
        problems.problems.extend(exc.problems)
    memory: int | None = None
    if cfg.memory_budget is not None:
        try:
            memory = parse_memory(cfg.memory_budget, name="memory_budget")
        except ConfigError as exc:
            problems.problems.extend(exc.problems)
    known = task_metrics(task)
    objective = cfg.objective or default_objective(known)
    obj = parse_objective(objective, problems)
    metric, maximize = objective.partition(":")[0], True
    if obj is not None:
        metric, maximize = obj.metric, obj.direction == "maximize"
        if ":" not in objective:  # the direction comes from the registry, which must know the name
            try:
                get_metric(metric, task=task)
            except ConfigError as exc:
                problems.problems.extend(exc.problems)
        if known is not None and metric not in known:
            problems.add(f"objective={objective!r}: task {name!r} does not report {metric!r}; its "
                         f"metrics: {', '.join(known)}.")
    for text in cfg.constraints:
        parse_constraint(text, problems)
    if cfg.space is not None:
        try:
            load_space(cfg.space)
        except ConfigError as exc:
            shown = f"space={cfg.space!r}" if isinstance(cfg.space, str) else "space="
            # a problem naming the file already (it does not exist) is not prefixed with it again
            problems.problems.extend(p if str(cfg.space) in p else f"{shown}: {p}" for p in exc.problems)
    if cfg.goal not in OPTIMIZE_GOALS:
        problems.add(f"goal={cfg.goal!r} is unknown; valid: {', '.join(OPTIMIZE_GOALS)}.")
    if not cfg.max_accuracy_drop >= 0:
        problems.add(f"max_accuracy_drop={cfg.max_accuracy_drop!r} must be >= 0 (metric units).")
    if isinstance(cfg.seeds, bool) or int(cfg.seeds) < 1:
        problems.add(f"seeds={cfg.seeds!r} must be at least 1.")
    for key in ("patience", "max_trials", "flag_min"):
        if int(getattr(cfg, key)) < 1:
            problems.add(f"{key}={getattr(cfg, key)!r} must be at least 1.")
    if cfg.min_delta < 0:
        problems.add(f"min_delta={cfg.min_delta!r} must be >= 0.")
    if cfg.on_trial is not None and not callable(cfg.on_trial):
        problems.add(f"on_trial={cfg.on_trial!r} must be a callable of a trial's RunRecord (or None).")
    if cfg.out is not None and not str(cfg.out).strip():
        problems.add(f"out={cfg.out!r} is empty: name a folder, or leave it out for the default "
                     f"./proftune-optimize/{_safe(name)}/.")
    out = Path(cfg.out) if cfg.out is not None and str(cfg.out).strip() else Path("proftune-optimize") / _safe(name)
    out = out.absolute()  # at the start: a task that changes the working folder must not move it
    stored = check_out_dir(out, resume=cfg.resume, study=cfg.study, task=name, problems=problems)
    problems.raise_if_any(header="optimize: the options are not well-formed, found the following errors:")
    return Validated(cfg=cfg, budget_s=budget_s, memory_bytes=memory, metric=metric, maximize=maximize,
                     objective=f"{metric}:{'max' if maximize else 'min'}", out=out, stored=stored)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "task"


def default_study(task_name: str) -> str:
    return f"optimize-{_safe(task_name)}-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{os.getpid()}"
