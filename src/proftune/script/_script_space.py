"""The search space of a script: from its flags' names and defaults, as a built-in task's is made
from its default params (:func:`proftune.optimize.build_plan`), narrowed or extended by the user's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..exceptions import ProblemCollector
from ..optimize import build_plan
from ..search import Space, load_space
from ._task import PROTOCOL_FLAGS, ScriptTask

__all__ = ["script_space"]

#: Flag names that mean a param the fit loop knows, under its name there.
ALIASES = {"learning_rate": "lr", "wd": "weight_decay", "bs": "batch_size", "batch": "batch_size",
           "train_batch_size": "batch_size", "per_device_train_batch_size": "batch_size"}


def _searchable(task: ScriptTask, name: str) -> bool:
    f = task.flags[name]
    return f.settable and name not in PROTOCOL_FLAGS and not name.endswith(("_dir", "_path", "_file"))


def script_space(task: ScriptTask, user_space: str | Path | Mapping[str, Any] | None = None) -> Space:
    """The space a script is searched in: its flags the way a task's default params are (lr and
    weight decay log-wide around the default, batch sizes an eighth to eight times it, dropout in
    [0, 0.5], other integer sizes half to double), its ``choices`` flags categorical, its protocol
    (epochs, seed, workers) as it has it; then ``user_space``'s params replace or add to these (each
    must name a flag), and its ``fixed`` set flags for every run."""
    names = [f.dest for f in task.flags.flags if _searchable(task, f.dest)]
    canonical = {ALIASES.get(n, n): n for n in names}
    probe = ScriptTask.__new__(ScriptTask)  # the defaults under the fit loop's names, for build_plan
    probe.default_params = {c: task.default_params.get(n) for c, n in canonical.items()  # type: ignore[misc]
                            if task.default_params.get(n) is not None}
    plan = build_plan(probe, {}, user_space=None, max_batch=None, samples=None)
    raw = plan.space.to_dict()
    params: dict[str, Any] = {}
    for c, spec in raw.get("params", {}).items():
        if c in canonical and task.flags[canonical[c]].choices is None:
            spec = {k: v for k, v in spec.items() if k not in ("when", "tier", "default")}
            default = task.default_params.get(canonical[c])
            if task.flags[canonical[c]].type == "int" and spec.get("type") == "float":
                spec = {**spec, "type": "int", "low": max(1, int(spec["low"])), "high": int(spec["high"])}
            params[canonical[c]] = spec
            if isinstance(default, bool) or default is None:
                params.pop(canonical[c])
    for n in names:
        f = task.flags[n]
        if f.choices:
            params[n] = {"type": "categorical", "choices": list(f.choices)}
    fixed: dict[str, Any] = {}
    if user_space is not None:
        given = load_space(user_space).to_dict()
        problems = ProblemCollector()
        valid = sorted(f.dest for f in task.flags.flags if f.settable)
        for key in [*given.get("params", {}), *given.get("fixed", {})]:
            if key not in task.flags or not task.flags[key].settable:
                problems.add(f"space param {key!r} is not a flag of {task.name}; valid (argparse dest names): "
                             f"{', '.join(valid)}.")
        problems.raise_if_any(header="the search space does not fit the script, found the following errors:")
        params.update(given.get("params", {}))
        fixed.update(given.get("fixed", {}))
        for key in fixed:
            params.pop(key, None)
        extra = {k: v for k, v in given.items() if k in ("forbid",) and v}
        return load_space({"params": params, "fixed": fixed, **extra})
    return load_space({"params": params, "fixed": fixed})
