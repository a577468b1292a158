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
    """Everything a worker process needs to run trials of a study (picklable); the ``settings`` a
    sampler plug-in's ``make`` and a search backend's ``run`` are given, read by attribute."""

    task: Any  # a task spec string, or a Task (single process)
    space: Space
    objectives: list[Objective]
    constraints: list[Constraint]
    trials: int
    study: str
    db: str
    #: A key of ``SAMPLERS`` / ``PRUNERS``, or the user's own Optuna sampler / pruner.
    sampler: Any = "tpe"
    pruner: Any = "none"
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
    env: dict[str, object] = field(default_factory=dict)
    task_name: str = ""
    #: The most of ``trials`` that re-evaluate leading configurations (0: none).
    reevaluate: float = 0.0
    #: A folder for the models of leading trials (``SearchConfig.keep_models``); None: none kept.
    keep_models: str | None = None

    @property
    def gated_limit(self) -> int:
        """Trials that may end before training before the study stops."""
        return self.max_gated if self.max_gated is not None else max(20, 10 * self.trials)

    @property
    def directions(self) -> list[str]:
        """Each objective's Optuna direction (``maximize`` or ``minimize``), in order."""
        return [o.direction for o in self.objectives]


def check_settings(settings: SearchSettings, problems: ProblemCollector) -> None:
    """Problems of the combination of options (each option alone is checked where parsed); each
    names the :class:`~proftune.search.SearchConfig` field (``trials=0``), which the CLI reads as
    its flag."""
    multi = len(settings.objectives) > 1
    given = f"objectives= has {len(settings.objectives)} ({', '.join(o.text for o in settings.objectives)})"
    pruner = settings.pruner if isinstance(settings.pruner, str) else type(settings.pruner).__name__
    if pruner not in ("none", "NopPruner"):
        if multi:
            problems.add(f"pruner={pruner!r} needs one objective (Optuna cannot prune "
                         f"multi-objective trials), but {given}.")
        elif settings.objectives and settings.objectives[0].is_profile:
            problems.add(f"pruner={pruner!r} needs a task metric as the objective, but got "
                         f"{settings.objectives[0].text!r} (a profile metric, known before training).")
    if settings.coarse not in ("halton", "grid"):
        problems.add(f"coarse={settings.coarse!r} is unknown; valid: halton, grid.")
    if settings.sampler == "coarse-to-fine" and multi:
        problems.add(f"sampler='coarse-to-fine' ranks trials by one objective, but {given}; give one, "
                     "or use sampler='nsga2' or 'tpe' for a Pareto front.")
    if settings.space.tiers and multi:
        problems.add(f"a staged space (tiers) fixes each stage's best by one objective, but {given}; give one.")
    if settings.space.tiers and settings.sampler in ("grid", "halton", "sobol"):
        problems.add(f"sampler={settings.sampler!r} needs every param in each trial; a staged space "
                     "(tiers) searches a few at a time; use sampler='tpe', 'random' or 'nsga2'.")
    minimums = (("trials", settings.trials, 1), ("max_gated", settings.max_gated, 0),
                ("workers", settings.workers, 1), ("max_failures", settings.max_failures, 0),
                ("epochs", settings.epochs, 1))
    for option, value, low in minimums:
        if value is not None and value < low:
            problems.add(f"{option}={value!r} must be >= {low}.")
    if settings.timeout is not None and settings.timeout <= 0:
        problems.add(f"timeout={settings.timeout!r} must be > 0 seconds.")
    if settings.pruner == "patience" and int(settings.space.pruner.get("patience", 2)) < 1:
        problems.add(f"pruner patience={settings.space.pruner.get('patience')} must be >= 1.")
