"""The params of one training, checked once: :class:`TrainParams`, and :func:`validate_params`.

A configuration goes from a decision (the defaults, a search's trial, a race's arm) to the fit
loop. Made here once, merged with the task's defaults and validated, it is passed along as it is:
:func:`proftune.train.fit` and :func:`proftune._api.run_train` take it without checking it again.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._optimizers import OPTIMIZERS
from .exceptions import ProblemCollector

if TYPE_CHECKING:
    from .task import Task

__all__ = ["LOOP_PARAMS", "PRECISIONS", "TrainParams", "as_train_params", "validate_params"]

PRECISIONS = ("fp32", "bf16", "fp16")
#: Params with a meaning to the loop; every other param goes to the task untouched.
LOOP_PARAMS = (
    "lr", "batch_size", "weight_decay", "optimizer", "momentum",
    "grad_accumulation", "grad_clip", "precision",
)


def validate_params(params: dict[str, Any]) -> dict[str, Any]:
    """Check and normalise the params the loop understands; one error lists every problem."""
    out = dict(params)
    problems = ProblemCollector()

    def number(key: str, kind: type, *, low: float | None = None, strict: bool = False) -> None:
        if key not in out:
            return
        value = out[key]
        try:
            if isinstance(value, bool):
                raise TypeError
            converted = kind(value)
            if kind is int and float(value) != converted:
                raise ValueError
        except (TypeError, ValueError):
            problems.add(f"param {key}={value!r} must be {'an integer' if kind is int else 'a number'}.")
            return
        if isinstance(converted, float) and not math.isfinite(converted):
            problems.add(f"param {key}={value!r} must be finite.")
            return
        if low is not None and (converted <= low if strict else converted < low):
            problems.add(f"param {key}={value!r} must be {'>' if strict else '>='} {low}.")
            return
        out[key] = converted

    number("lr", float, low=0.0, strict=True)
    number("batch_size", int, low=1)
    number("weight_decay", float, low=0.0)
    number("momentum", float, low=0.0)
    number("grad_accumulation", int, low=1)
    number("grad_clip", float, low=0.0, strict=True)
    if "optimizer" in out:
        name = str(out["optimizer"]).lower()
        if name not in OPTIMIZERS:
            problems.add(f"param optimizer={out['optimizer']!r} is unknown; valid: {', '.join(OPTIMIZERS)}.")
        out["optimizer"] = name
    if "precision" in out:
        prec = str(out["precision"]).lower()
        if prec not in PRECISIONS:
            problems.add(f"param precision={out['precision']!r} is unknown; valid: {', '.join(PRECISIONS)}.")
        out["precision"] = prec
    if out.get("optimizer") == "lbfgs" and int(out.get("grad_accumulation", 1) or 1) > 1:
        problems.add("param grad_accumulation must be 1 with optimizer='lbfgs' (it re-evaluates the loss).")
    for key, value in out.items():  # params are recorded, and sent to worker processes and checkpoints
        try:
            pickle.dumps(value)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            problems.add(f"param {key}={value!r} cannot be stored (pickled: {exc}); give it a value that can, "
                         "such as a number, a string or a function defined at a module's top level.")
    problems.raise_if_any()
    return out


@dataclass(frozen=True, init=False)
class TrainParams:
    """A training's params, validated where they are made: the fit loop's as fields (None: not
    given, the task's or the loop's default applies), the task's own in ``task_params``.

    ``TrainParams.of(task, params)`` merges the task's ``default_params`` with ``params``;
    ``TrainParams(params)`` takes them as they are. Either validates once
    (:func:`validate_params`, one error listing every problem); :func:`proftune.train.fit` takes
    the record without checking it again. ``.params`` is the dict the loop and the task read.
    """

    lr: float | None
    batch_size: int | None
    weight_decay: float | None
    optimizer: str | None
    momentum: float | None
    grad_accumulation: int | None
    grad_clip: float | None
    precision: str | None
    #: The params the loop does not read, for the task (``build_model``, ``train_data``).
    task_params: Mapping[str, Any]
    #: The params' names in the order given: ``.params`` keeps it, as the records show it.
    order: tuple[str, ...] = field(repr=False, compare=False)

    def __init__(self, params: Mapping[str, Any] | None = None, /, **given: Any) -> None:
        valid = validate_params({**(params or {}), **given})
        for key in LOOP_PARAMS:
            object.__setattr__(self, key, valid.get(key))
        object.__setattr__(self, "task_params", {k: v for k, v in valid.items() if k not in LOOP_PARAMS})
        object.__setattr__(self, "order", tuple(valid))

    @classmethod
    def of(cls, task: Task, params: Mapping[str, Any] | None = None, /, **given: Any) -> TrainParams:
        """``params`` (and ``given`` by name) over ``task``'s ``default_params``, validated once."""
        return cls({**task.default_params, **(params or {}), **given})

    def with_params(self, **changes: Any) -> TrainParams:
        """A new record with ``changes`` over these params, validated again (as a new record is)."""
        return TrainParams({**self.params, **changes})

    @property
    def params(self) -> dict[str, Any]:
        """The params as one dict (a new one each call): the loop's that were given, and the task's."""
        return {k: self.task_params[k] if k in self.task_params else getattr(self, k) for k in self.order}


def as_train_params(task: Task, params: TrainParams | Mapping[str, Any] | None, *,
                    batch_size: int | None = None) -> TrainParams:
    """What a training entry point was given, as one record: a :class:`TrainParams` as it is
    (a different ``batch_size`` over it, validated again), a dict merged over ``task``'s defaults and validated."""
    resize = {} if batch_size is None else {"batch_size": batch_size}
    if isinstance(params, TrainParams):
        return params.with_params(**resize) if resize and batch_size != params.batch_size else params
    return TrainParams.of(task, params, **resize)
