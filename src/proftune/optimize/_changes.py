"""What a configuration changes against the defaults, param by param, and where each value came from.

The defaults a user compares with are the values in effect when nothing is set: the task's own
``default_params``, then what the task's code reads (``params.get("dropout", 0.0)``), then the
optimizer the task's own ``configure_optimizer`` builds from them (its first param group: an SGD
the task builds itself has weight decay 0, not the fit loop's 0.01), then the fit loop's (AdamW at
lr 1e-3 with weight decay 0.01, no accumulation, fp32). A param the result only makes explicit at
that value is not a change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .._optimizers import DEFAULT_LR, DEFAULT_MOMENTUM, DEFAULT_OPTIMIZER, default_weight_decay
from .._records import JsonRecord
from ..task import Task

__all__ = ["ParamChange", "defaults_in_effect", "optimizer_defaults", "param_changes"]


@dataclass(frozen=True)
class ParamChange(JsonRecord):
    """One param of a configuration against the defaults in effect, and where its value came from."""

    WHAT: ClassVar[str] = "a param change"
    param: str
    default: Any
    #: Whose default it is: ``task``, ``task code``, ``task's optimizer``, ``fit loop`` or ``-``.
    default_from: str
    value: Any
    changed: bool
    #: ``default``, ``computed``, ``fixed``, ``searched`` (or ``computed`` for the race's epochs).
    source: str
    #: The measurement or trial behind the value ("" for an unchanged one).
    why: str = ""

#: The fit loop's value for each param it reads when the params leave it out (``proftune.train``).
LOOP_DEFAULTS: dict[str, float | str | None] = {
    "lr": DEFAULT_LR, "optimizer": DEFAULT_OPTIMIZER, "grad_accumulation": 1, "precision": "fp32",
    "momentum": DEFAULT_MOMENTUM, "grad_clip": None}


#: The optimizer settings read off the optimizer a task builds (its first param group).
OPTIMIZER_KEYS = ("lr", "weight_decay", "momentum")


def optimizer_defaults(task: Task, params: Mapping[str, Any]) -> dict[str, float | str]:
    """The lr, weight decay and momentum of the optimizer the task's ``configure_optimizer`` builds
    from ``params`` (its first param group), and its name where the fit loop knows it; {} where
    it cannot be built (the baseline's training says why)."""
    try:
        model = task.build_model(dict(params))
        opt = task.configure_optimizer(model, dict(params))
    except Exception:  # noqa: BLE001 - a task that cannot build from its defaults fails loudly in the baseline stage
        return {}
    groups = getattr(opt, "param_groups", None)
    if not groups:
        return {}
    out: dict[str, float | str] = {}
    for key in OPTIMIZER_KEYS:
        value = groups[0].get(key)
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
    name = type(opt).__name__.lower()
    if name in ("adamw", "adam", "sgd"):
        out["optimizer"] = name
    return out


def defaults_in_effect(task_defaults: Mapping[str, Any], read_defaults: Mapping[str, Any],
                       built: Mapping[str, Any] | None = None) -> dict[str, object]:
    """Each param's value when the params leave it out: the task's, its code's, its optimizer's
    (``built``: :func:`optimizer_defaults`), then the loop's."""
    out: dict[str, object] = dict(LOOP_DEFAULTS)
    opt = str(task_defaults.get("optimizer", (built or {}).get("optimizer", out["optimizer"]))).lower()
    out["weight_decay"] = default_weight_decay(opt)
    out.update(built or {})
    out.update(read_defaults)
    out.update(task_defaults)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def _default_from(name: str, task_defaults: Mapping[str, Any], read_defaults: Mapping[str, Any],
                  built: Mapping[str, Any]) -> str:
    if name in task_defaults:
        return "task"
    if name in read_defaults:
        return "task code"
    if name in built:
        return "task's optimizer"
    return "fit loop" if name in LOOP_DEFAULTS or name == "weight_decay" else "-"


def param_changes(params: Mapping[str, Any], *, task_defaults: Mapping[str, Any],
                  read_defaults: Mapping[str, Any], computed: Mapping[str, Any],
                  reasons: Mapping[str, str], fixed: Mapping[str, Any], searched: str,
                  built: Mapping[str, Any] | None = None) -> list[ParamChange]:
    """One row per param of ``params`` (and of the defaults): its default, its value, whether it
    changed, and where the value came from.

    ``computed``: the compute stage's values (``reasons`` its recommendations' reasons, by name);
    ``fixed``: values the search space fixed; ``searched``: what the search measured for the
    configuration (one sentence with its figure), said of every searched param; ``built``: the
    settings of the optimizer the task builds (:func:`optimizer_defaults`).
    """
    built = dict(built or {})
    effect = defaults_in_effect(task_defaults, read_defaults, built)
    rows = []
    for name in sorted(set(params) | set(task_defaults)):
        value = params.get(name, effect.get(name))
        default = effect.get(name)
        changed = name not in effect or not _same(value, default)
        if not changed:
            source, why = "default", ""
        elif name in computed and _same(computed[name], value):
            source, why = "computed", reasons.get(name, "the compute stage (recommend)")
        elif name in fixed and _same(fixed[name], value):
            source, why = "fixed", "fixed by the search space"
        else:
            source, why = "searched", searched
        rows.append(ParamChange(param=name, default=default,
                                default_from=_default_from(name, task_defaults, read_defaults, built),
                                value=value, changed=changed, source=source, why=why))
    return rows
