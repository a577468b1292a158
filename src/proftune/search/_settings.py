"""What a worker needs to run trials of a study, and the checks of the options together."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..exceptions import ProblemCollector
from ._constraints import Constraint, Objective
from ._space import Space

__all__ = ["SearchSettings", "check_settings"]


@dataclass
class SearchSettings:
    """Everything a worker process needs to run trials of a study (picklable)."""

    task: Any  # a task spec string, or a Task (single process)
    space: Space
    objectives: list[Objective]
    constraints: list[Constraint]
    trials: int
    study: str
    db: str
    sampler: str = "tpe"
    pruner: str = "none"
    epochs: int | None = None
    max_steps: int | None = None
    timeout: float | None = None
    seed: int = 0
    device: str = "auto"
    max_failures: int = 5
    gate_steps: int = 3
    gate_warmup: int = 1
    grid_points: int = 5
    #: The coarse pass of ``coarse-to-fine``: ``halton`` or ``grid`` (``grid_points`` per param).
    coarse: str = "halton"
    workers: int = 1
    #: Trials that may end before training (gate, forbid rules) before the study stops;
    #: None: ten per trained trial asked for, at least 20.
    max_gated: int | None = None
    tune_run_id: int | None = None
    data_fingerprint: str | None = None
    env: dict[str, Any] = field(default_factory=dict)
    task_name: str = ""

    @property
    def gated_limit(self) -> int:
        return self.max_gated if self.max_gated is not None else max(20, 10 * self.trials)

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]


def check_settings(settings: SearchSettings, problems: ProblemCollector) -> None:
    """Problems of the combination of options (each option alone is checked where parsed)."""
    multi = len(settings.objectives) > 1
    if settings.pruner != "none":
        if multi:
            problems.add(f"--pruner {settings.pruner} needs one objective; Optuna cannot prune "
                         f"multi-objective trials (objectives: {[o.text for o in settings.objectives]}).")
        elif settings.objectives and settings.objectives[0].is_profile:
            problems.add(f"--pruner {settings.pruner} needs a task metric as the objective, but got "
                         f"{settings.objectives[0].text!r} (a profile metric, known before training).")
    if settings.coarse not in ("halton", "grid"):
        problems.add(f"coarse={settings.coarse!r} is unknown; valid: halton, grid.")
    if settings.sampler == "coarse-to-fine" and multi:
        problems.add("--sampler coarse-to-fine ranks trials by one objective; give one --objective "
                     "or use --sampler nsga2 / tpe for a Pareto front.")
    if settings.space.tiers and multi:
        problems.add("a staged space (tiers) fixes each stage's best by one objective; give one --objective.")
    if settings.space.tiers and settings.sampler in ("grid", "halton", "sobol"):
        problems.add(f"--sampler {settings.sampler} needs every param in each trial; a staged space "
                     "(tiers) searches a few at a time; use tpe, random or nsga2.")
    if settings.trials < 1:
        problems.add(f"--trials must be at least 1, but got {settings.trials}.")
    if settings.max_gated is not None and settings.max_gated < 0:
        problems.add(f"--max-gated must be >= 0, but got {settings.max_gated}.")
    if settings.workers < 1:
        problems.add(f"--workers must be at least 1, but got {settings.workers}.")
    if settings.max_failures < 0:
        problems.add(f"--max-failures must be >= 0, but got {settings.max_failures}.")
    if settings.timeout is not None and settings.timeout <= 0:
        problems.add(f"--timeout must be > 0 seconds, but got {settings.timeout}.")
    if settings.epochs is not None and settings.epochs < 1:
        problems.add(f"--epochs must be at least 1, but got {settings.epochs}.")
    if settings.pruner == "patience" and int(settings.space.pruner.get("patience", 2)) < 1:
        problems.add(f"pruner patience={settings.space.pruner.get('patience')} must be >= 1.")
