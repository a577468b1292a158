"""The one registry of metric names: direction, unit, and which stage produces each.

Every consumer that needs to know whether a metric is better high or low, or whether a stage can
produce it (search constraints and objectives, the compress goal, ``EarlyStopping``, the bandit,
``optimize``) asks this module; nobody guesses a direction from a name.

Stages (:data:`METRIC_STAGES`, named in ``Metric.stages``):

- ``static``: counted from the model without running a step (params, MACs, size);
- ``step``: measured by profiling a few training steps (``Profile`` with ``detail="step"``);
- ``inference``: measured by timing the forward pass in eval mode (latency);
- ``evaluate``: returned by the task's ``evaluate()`` after training;
- ``train``: recorded by the fit loop while training (train loss).

Each metric has one producer (``Metric.producer``, a function every consumer calls rather than
measuring the number its own way). The two deployment figures:

- ``latency_ms`` (:func:`proftune.profile.task_latencies` over
  :func:`proftune.profile.time_forwards`): one forward pass at batch 1 in eval mode under
  ``torch.inference_mode`` on the inputs the task's loss feeds the model; after a warm-up, the
  median of the forwards timed in several interleaved rounds; on CPU at one intra-op thread,
  denormals flushed, each forward timed by the process's CPU time (load-proof); at several
  threads or on CUDA by the (synchronised) wall clock.
- ``size_bytes`` (:func:`proftune.profile.size_bytes`): bytes as saved: the artifact's file size
  where the model is a file (quantized, compiled, exported), else the bytes ``torch.save`` writes
  for the state dict.

A task may name metrics of its own in ``evaluate()``; their direction comes from this registry
when the name is a well-known one (``accuracy``, ``f1``, ``mse``, ...), else from the task's
``metric_directions`` mapping (``{"bleu": "max"}``), else the caller must say it (``name:max``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ._deprecated import renamed
from ._registry import Registry
from .exceptions import ConfigError

__all__ = [
    "METRICS",
    "METRIC_STAGES",
    "Metric",
    "better",
    "default_objective",
    "direction",
    "get_metric",
    "is_known",
    "metric_names",
    "produced_by",
    "register_metric",
    "resolve_direction",
    "split_objective",
]

Direction = Literal["min", "max"]

#: The stages that produce metrics, in the order a configuration meets them.
METRIC_STAGES: tuple[str, ...] = ("static", "step", "inference", "train", "evaluate")


@dataclass(frozen=True)
class Metric:
    """A metric name with its direction (``min``/``max``), unit and the stages that produce it."""

    name: str
    direction: Direction
    unit: str
    #: The stages (:data:`METRIC_STAGES`) whose runs produce it.
    stages: tuple[str, ...]
    description: str
    #: The one function that produces the number (dotted path; ``Task.evaluate`` for a task's own).
    producer: str = ""

    @property
    def producers(self) -> tuple[str, ...]:
        """Deprecated: :attr:`stages` (``producer`` is the function, ``stages`` where it runs)."""
        from ._deprecated import warn_deprecated

        warn_deprecated("Metric.producers", use="Metric.stages (the same tuple)")
        return self.stages

    @property
    def optuna_direction(self) -> str:
        """``minimize`` or ``maximize``, as Optuna spells it."""
        return "maximize" if self.direction == "max" else "minimize"

    @property
    def is_profile(self) -> bool:
        """Produced without training (static counts, a profiled step, an inference timing)."""
        return any(p in ("static", "step", "inference") for p in self.stages)

    @property
    def is_static(self) -> bool:
        """Counted from the model alone, no step run."""
        return "static" in self.stages


#: The producer of each stage's metrics, where one function produces the whole stage.
_STAGE_PRODUCER = {"static": "proftune.profile.count_model", "step": "proftune.profile.profile",
                   "inference": "proftune.profile.task_latencies", "evaluate": "Task.evaluate",
                   "train": "proftune.train.fit"}


def _m(name: str, direction: Direction, unit: str, stages: tuple[str, ...], description: str,
       producer: str = "") -> Metric:
    return Metric(name, direction, unit, stages, description, producer or _STAGE_PRODUCER[stages[0]])


_PROFILE = (
    _m("step_time_ms", "min", "ms", ("step",), "wall time of one training step (forward, backward, optimizer)"),
    _m("peak_memory_bytes", "min", "bytes", ("step",), "peak memory of one training step"),
    _m("throughput", "max", "samples/s", ("step",), "training samples per second"),
    _m("grad_var", "min", "", ("step",), "variance of the gradient across micro-batches"),
    _m("grad_norm", "min", "", ("step",), "global L2 norm of the gradient"),
    _m("params", "min", "count", ("static",), "number of parameters"),
    _m("macs", "min", "count", ("static",), "multiply-accumulates of one forward pass"),
    _m("flops", "min", "count", ("static",), "floating-point operations of one forward pass (2 x MACs)"),
    _m("size_bytes", "min", "bytes", ("static",), "bytes as saved: the artifact's file, else torch.save "
       "of the state dict", "proftune.profile.size_bytes"),
    _m("latency_ms", "min", "ms", ("inference",), "one forward at batch 1 in eval mode: median of interleaved "
       "rounds after a warm-up, CPU time at 1 thread on CPU, else the wall clock"),
)

# Well-known names that tasks return from evaluate(); a task may return others and declare them.
_TASK = (
    _m("accuracy", "max", "ratio", ("evaluate",), "share of correct predictions"),
    _m("top1", "max", "ratio", ("evaluate",), "top-1 accuracy"),
    _m("top5", "max", "ratio", ("evaluate",), "top-5 accuracy"),
    _m("f1", "max", "ratio", ("evaluate",), "F1 score"),
    _m("precision", "max", "ratio", ("evaluate",), "precision"),
    _m("recall", "max", "ratio", ("evaluate",), "recall"),
    _m("auc", "max", "ratio", ("evaluate",), "area under the ROC curve"),
    _m("roc_auc", "max", "ratio", ("evaluate",), "area under the ROC curve"),
    _m("r2", "max", "", ("evaluate",), "coefficient of determination"),
    _m("bleu", "max", "", ("evaluate",), "BLEU score"),
    _m("val_loss", "min", "", ("evaluate",), "loss on the validation data"),
    _m("loss", "min", "", ("evaluate",), "loss"),
    _m("mse", "min", "", ("evaluate",), "mean squared error"),
    _m("rmse", "min", "", ("evaluate",), "root mean squared error"),
    _m("mae", "min", "", ("evaluate",), "mean absolute error"),
    _m("error", "min", "ratio", ("evaluate",), "error rate"),
    _m("perplexity", "min", "", ("evaluate",), "perplexity"),
    _m("train_loss", "min", "", ("train",), "mean training loss of the last epoch"),
)

#: Every metric proftune knows, by name: the built-ins, then what :func:`register_metric` (or an
#: installed plug-in's ``proftune.metrics`` entry point) added.
METRICS: Registry[Metric] = Registry("metric", key=lambda m: m.name, entry_points="proftune.metrics")


def register_metric(metric: Metric, *, replace: bool = False) -> Metric:
    """Make ``metric`` known by its name: its direction, unit and the stages that produce it are
    then what every consumer (constraints, objectives, goals, early stopping, the bandit, the
    report) reads. A built-in's name needs ``replace=True``."""
    problems = []
    if not isinstance(metric, Metric):
        raise ConfigError(f"metric={metric!r} is not a proftune.metrics.Metric.")
    if metric.direction not in ("min", "max"):
        problems.append(f"direction={metric.direction!r} is unknown; valid: max, min.")
    unknown = [s for s in metric.stages if s not in METRIC_STAGES]
    if not metric.stages or unknown:
        problems.append(f"stages={metric.stages!r} must name at least one of {', '.join(METRIC_STAGES)}.")
    if problems:
        raise ConfigError([f"metric {metric.name!r}: {p}" for p in problems])
    return METRICS.add(metric, replace=replace)


METRICS.loads_through(register_metric)


for _metric in (*_PROFILE, *_TASK):
    register_metric(_metric)


def metric_names(*, stage: str | None = None) -> tuple[str, ...]:
    """Known metric names, or those ``stage`` produces."""
    if stage is None:
        return tuple(METRICS)
    return produced_by(stage)


def produced_by(stage: str) -> tuple[str, ...]:
    """The metric names that ``stage`` produces (one of :data:`METRIC_STAGES`)."""
    if stage not in METRIC_STAGES:
        raise ConfigError(f"stage={stage!r} is unknown; valid: {', '.join(METRIC_STAGES)}.")
    return tuple(name for name, m in METRICS.items() if stage in m.stages)


def is_known(name: str) -> bool:
    return name in METRICS


def get_metric(name: str, *, task: Any = None) -> Metric:
    """The registry's entry for ``name``; a task's own declared metric gets an entry too.

    Raises :class:`ConfigError` naming the valid metrics when nothing knows ``name``.
    """
    if name in METRICS:
        return METRICS[name]
    declared = _task_directions(task)
    if name in declared:
        return Metric(name, declared[name], "", ("evaluate",), "declared by the task", "Task.evaluate")
    valid = sorted(set(METRICS) | set(declared))
    raise ConfigError(
        f"metric {name!r} is unknown; known metrics: {', '.join(valid)}. A task metric of "
        "another name needs a direction: declare it in the task's metric_directions "
        "(e.g. {'bleu': 'max'}) or give it as NAME:max / NAME:min."
    )


def direction(name: str, *, task: Any = None) -> Direction:
    """``min`` or ``max`` for ``name`` (see :func:`get_metric`)."""
    return get_metric(name, task=task).direction


def resolve_direction(name: str, given: str | None = None, *, task: Any = None) -> Direction:
    """The direction the user gave (``max``/``min``/``maximize``/...) or the registry's."""
    if given is None or given == "" or given == "auto":
        return direction(name, task=task)
    g = given.strip().lower()
    if g in ("max", "maximize", "maximise"):
        return "max"
    if g in ("min", "minimize", "minimise"):
        return "min"
    raise ConfigError(f"direction {given!r} for metric {name!r} is unknown; valid: max, min.")


def default_objective(reported: Iterable[str] | None) -> str:
    """The objective when none is given: ``accuracy:max`` when the task reports accuracy (or what it
    reports cannot be known before training), else ``val_loss:min``, which every task reports."""
    return "accuracy:max" if reported is None or "accuracy" in set(reported) else "val_loss:min"


def split_objective(text: str, *, task: Any = None) -> tuple[str, Direction]:
    """``"accuracy:max"`` -> ``("accuracy", "max")``; without ``:DIR`` the direction is the
    registry's or the task's declared one (:func:`resolve_direction`), never guessed from the name.

    Raises :class:`ConfigError` when neither the text nor anyone else says the direction.
    """
    name, _, given = str(text).strip().partition(":")
    name = name.strip()
    return name, resolve_direction(name, given.strip() or None, task=task)


def better(name: str, a: float, b: float, *, task: Any = None) -> bool:
    """Whether value ``a`` of metric ``name`` is strictly better than ``b``."""
    return a > b if direction(name, task=task) == "max" else a < b


def _task_directions(task: Any) -> dict[str, Direction]:
    declared = getattr(task, "metric_directions", None) or {}
    out: dict[str, Direction] = {}
    items: Iterable[tuple[Any, Any]] = declared.items() if isinstance(declared, Mapping) else ()
    for key, value in items:
        v = str(value).lower()
        if v in ("max", "maximize"):
            out[str(key)] = "max"
        elif v in ("min", "minimize"):
            out[str(key)] = "min"
    return out


#: ``STAGES``: the former name of :data:`METRIC_STAGES` (``optimize`` has stages of its own), deprecated.
__getattr__ = renamed(__name__, {"STAGES": "METRIC_STAGES"})
