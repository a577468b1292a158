"""The search space: a YAML file of float, int and categorical params, conditions and rules.

```yaml
params:
  lr:         {type: float, low: 1.0e-4, high: 0.1, log: true, tier: training}
  batch_size: {type: categorical, choices: [32, 64, 128]}
  width:      {type: int, low: 8, high: 64, step: 8, tier: architecture}
  optimizer:  {type: categorical, choices: [adamw, sgd]}
  momentum:   {type: float, low: 0.0, high: 0.99, when: {optimizer: sgd}}
fixed: {weight_decay: 0.0}            # passed to every trial, not searched
forbid:                                # combinations known to be invalid
  - {optimizer: sgd, lr: ">0.05"}
tiers: [architecture, training, regularization]   # staged search order (optional)
```

Validation collects every problem of the file into one :class:`~proftune.ConfigError`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._jsonsafe import json_dumps
from ..exceptions import ConfigError, ProblemCollector

__all__ = ["PARAM_TYPES", "TIERS", "ForbidRule", "Param", "Space", "load_space"]

PARAM_TYPES = ("float", "int", "categorical")
#: The default order of the stages of a staged search.
TIERS = ("architecture", "training", "regularization")
_PARAM_KEYS = {"type", "low", "high", "log", "step", "choices", "when", "tier", "default"}
_TOP_KEYS = {"params", "fixed", "forbid", "tiers", "pruner"}
_NUMBER = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")
_COMPARISON = re.compile(r"^\s*(<=|>=|==|!=|<|>)\s*(.+?)\s*$")


def _number(value: Any) -> float | None:
    """A YAML scalar as a float (YAML 1.1 reads ``1e-4`` as a string), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and _NUMBER.match(value):
        return float(value)
    return None


def _scalar(value: Any) -> Any:
    """Numbers written as strings become numbers; everything else stays."""
    if isinstance(value, str):
        num = _number(value)
        if num is not None:
            return int(num) if num.is_integer() and re.fullmatch(r"[+-]?\d+", value.strip()) else num
    return value


@dataclass(frozen=True)
class Param:
    """One searched parameter.

    ``when`` maps other params to the value (or list of values) they must take for this one to
    be searched; ``tier`` names the stage of a staged search it belongs to.
    """

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    tier: str | None = None
    default: Any = None

    def active(self, values: Mapping[str, Any]) -> bool:
        """Whether this param is searched, given the values chosen so far."""
        return all(name in values and values[name] in allowed for name, allowed in self.when)

    def suggest(self, trial: Any) -> Any:
        """Ask an Optuna trial for a value."""
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        assert self.low is not None
        assert self.high is not None
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high),
                                     step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def distribution(self) -> Any:
        """The matching Optuna distribution."""
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if self.type == "categorical":
            return CategoricalDistribution(list(self.choices))
        assert self.low is not None
        assert self.high is not None
        if self.type == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def center(self) -> Any:
        """The value used while this param is not searched: ``default``, else the middle."""
        if self.default is not None:
            return self.default
        if self.type == "categorical":
            return self.choices[0]
        assert self.low is not None
        assert self.high is not None
        mid = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        return self.snap(mid)

    def snap(self, value: float) -> Any:
        """``value`` clipped to [low, high] and rounded onto the param's step (ints rounded)."""
        assert self.low is not None
        assert self.high is not None
        value = min(max(value, self.low), self.high)
        if self.step:
            value = self.low + round((value - self.low) / self.step) * self.step
            value = min(value, self.high)
        if self.type == "int":
            return round(value)
        return float(value)

    def grid(self, n: int) -> list[Any]:
        """Grid points: every choice, every int/step value when few, else ``n`` points."""
        if self.type == "categorical":
            return list(self.choices)
        assert self.low is not None
        assert self.high is not None
        if self.step or self.type == "int":
            step = self.step or 1
            count = math.floor((self.high - self.low) / step + 1e-9) + 1
            if count <= n:
                return [self.snap(self.low + i * step) for i in range(count)]
        if n == 1:
            return [self.center()]
        if self.log:
            lo, hi = math.log(self.low), math.log(self.high)
            pts = [math.exp(lo + (hi - lo) * i / (n - 1)) for i in range(n)]
        else:
            pts = [self.low + (self.high - self.low) * i / (n - 1) for i in range(n)]
        out: list[Any] = []
        for p in pts:
            v = self.snap(p)
            if v not in out:
                out.append(v)
        return out

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"type": self.type}
        if self.type == "categorical":
            d["choices"] = list(self.choices)
        else:
            d.update(low=self.low, high=self.high, log=self.log)
            if self.step is not None:
                d["step"] = self.step
        if self.when:
            d["when"] = {k: list(v) for k, v in self.when}
        if self.tier:
            d["tier"] = self.tier
        if self.default is not None:
            d["default"] = self.default
        return d


@dataclass(frozen=True)
class ForbidRule:
    """A combination known to be invalid: every condition holds -> the configuration is forbidden.

    A condition is a value (equal), a list (one of), or a comparison string ``">0.05"``.
    """

    conditions: tuple[tuple[str, str, Any], ...]  # (param, op, operand)

    def matches(self, values: Mapping[str, Any]) -> bool:
        for name, op, operand in self.conditions:
            if name not in values:
                return False
            v = values[name]
            if op == "in":
                ok = v in operand
            elif op == "==":
                ok = v == operand
            elif op == "!=":
                ok = v != operand
            else:
                num = _number(v)
                if num is None:
                    return False
                ok = {"<": num < operand, "<=": num <= operand, ">": num > operand,
                      ">=": num >= operand}[op]
            if not ok:
                return False
        return True

    def describe(self) -> str:
        parts = []
        for name, op, operand in self.conditions:
            if op == "in":
                parts.append(f"{name} in {list(operand)}")
            else:
                parts.append(f"{name}{op}{operand}")
        return " and ".join(parts)


@dataclass(frozen=True)
class Space:
    """A validated search space (see the module docstring for the YAML form)."""

    params: tuple[Param, ...]
    fixed: dict[str, Any] = field(default_factory=dict)
    forbid: tuple[ForbidRule, ...] = ()
    tiers: tuple[str, ...] = ()
    pruner: dict[str, float] = field(default_factory=dict)
    source: str | None = None

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, *, source: str | None = None) -> Space:
        """Validate ``data`` (the parsed YAML) and build the space; one error lists every problem."""
        where = f"space {source!r}" if source else "space"
        problems = ProblemCollector()
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where} must be a mapping with a 'params:' section, but got {type(data).__name__}.")
        if "params" not in data and data and all(isinstance(v, Mapping) and "type" in v for v in data.values()):
            data = {"params": data}
        for key in data:
            if key not in _TOP_KEYS:
                problems.add(f"{where}: unknown section {key!r}; valid: {', '.join(sorted(_TOP_KEYS))}.")
        raw_params = data.get("params")
        if not isinstance(raw_params, Mapping) or not raw_params:
            problems.add(f"{where}: 'params:' must be a non-empty mapping of name -> spec.")
            raw_params = {}
        params = [p for p in (_parse_param(str(n), s, problems) for n, s in raw_params.items()) if p]
        names = {p.name for p in params}
        _check_when(params, problems)
        _check_cycles(params, problems)
        fixed = _parse_fixed(where, data.get("fixed") or {}, names, problems)
        forbid = _parse_forbid(data.get("forbid") or [], names | set(fixed), problems)
        tiers = _parse_tiers(where, data.get("tiers"), params, problems)
        pruner = _parse_pruner(where, data.get("pruner") or {}, problems)
        problems.raise_if_any(header=f"{where} is not well-formed, found the following errors:")
        return cls(params=tuple(params), fixed=dict(fixed), forbid=tuple(forbid),
                   tiers=tiers if len(tiers) > 1 else (), pruner=pruner, source=source)

    # -- using ------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def suggest(self, trial: Any, *, only: Sequence[str] | None = None,
                preset: Mapping[str, object] | None = None) -> dict[str, object]:
        """Values for one trial: active params asked from ``trial`` (in file order).

        ``only`` limits the searched params (a stage of a staged search); the others take the
        ``preset`` value, else their :meth:`Param.center`.
        """
        values: dict[str, object] = dict(self.fixed)
        chosen: dict[str, object] = {}
        for p in self.params:
            if not p.active(values):
                continue
            if only is None or p.name in only:
                chosen[p.name] = p.suggest(trial)
            else:
                chosen[p.name] = (preset or {}).get(p.name, p.center())
            values[p.name] = chosen[p.name]
        return chosen

    def forbidden(self, values: Mapping[str, Any]) -> ForbidRule | None:
        """The first rule that ``values`` (fixed params included) break, or None."""
        merged = {**self.fixed, **values}
        for rule in self.forbid:
            if rule.matches(merged):
                return rule
        return None

    def grid(self, n: int = 5) -> dict[str, list[Any]]:
        """Grid search space for Optuna's GridSampler: ``n`` points per continuous param."""
        return {p.name: p.grid(n) for p in self.params}

    def to_dict(self) -> dict[str, Any]:
        """The definition, in a canonical form (what the study stores and hashes)."""
        return {
            "params": {p.name: p.to_dict() for p in self.params},
            "fixed": dict(sorted(self.fixed.items())),
            "forbid": [[list(c) if not isinstance(c[2], tuple) else [c[0], c[1], list(c[2])]
                        for c in r.conditions] for r in self.forbid],
            "tiers": list(self.tiers),
        }

    def hash(self) -> str:
        """SHA-256 (16 hex digits) of the canonical definition: same space <-> same hash."""
        text = json_dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_space(source: str | Path | Mapping[str, Any] | Space) -> Space:
    """A :class:`Space` from a YAML file path, a YAML string, a dict, or a Space."""
    if isinstance(source, Space):
        return source
    if isinstance(source, Mapping):
        return Space.from_dict(source)
    import yaml

    text: str
    origin: str | None
    path = Path(str(source))
    if isinstance(source, Path) or (len(str(source)) < 4096 and "\n" not in str(source)
                                    and (path.suffix in (".yaml", ".yml", ".json") or path.exists())):
        if not path.is_file():
            raise ConfigError(f"space={str(source)!r} does not exist (looked for {path.resolve()}).")
        try:
            text, origin = path.read_text(encoding="utf-8"), str(path)
        except UnicodeDecodeError as exc:
            raise ConfigError(f"space={str(source)!r} is not a text file ({exc.reason} at byte "
                              f"{exc.start}); expected a YAML or JSON search space, e.g. "
                              "'params: {lr: {type: float, low: 1.0e-4, high: 0.1, log: true}}'.") from None
    else:
        text, origin = str(source), None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"space {origin or '<text>'!r} is not valid YAML: {exc}") from exc
    return Space.from_dict(data, source=origin)


# -- parsing helpers ------------------------------------------------------------------------
def _check_when(params: Sequence[Param], problems: ProblemCollector) -> None:
    """Each ``when`` names another known param, and a categorical one by its choices."""
    by_name = {p.name: p for p in params}
    for p in params:
        for other, allowed in p.when:
            if other == p.name:
                problems.add(f"param {p.name!r}: 'when' refers to itself.")
            elif other not in by_name:
                problems.add(f"param {p.name!r}: 'when' refers to unknown param {other!r}; "
                             f"known: {', '.join(sorted(by_name))}.")
            elif by_name[other].type == "categorical":
                bad = [a for a in allowed if a not in by_name[other].choices]
                if bad:
                    problems.add(f"param {p.name!r}: 'when' {other}={bad} is not among "
                                 f"{other}'s choices {list(by_name[other].choices)}.")


def _parse_fixed(where: str, raw: Any, names: set[str], problems: ProblemCollector) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        problems.add(f"{where}: 'fixed:' must be a mapping of name -> value, but got {raw!r}.")
        return {}
    fixed = {str(k): _scalar(v) for k, v in raw.items()}
    for k in fixed:
        if k in names:
            problems.add(f"{where}: {k!r} is both searched (params) and fixed; keep one.")
    return fixed


def _parse_tiers(where: str, raw: Any, params: Sequence[Param], problems: ProblemCollector) -> tuple[str, ...]:
    used = [p.tier for p in params if p.tier]
    if raw is None:
        tiers = tuple(t for t in TIERS if t in used)
        tiers += tuple(dict.fromkeys(t for t in used if t not in TIERS))
    elif isinstance(raw, Sequence) and not isinstance(raw, str):
        tiers = tuple(str(t) for t in raw)
        for p in params:
            if p.tier and p.tier not in tiers:
                problems.add(f"param {p.name!r}: tier={p.tier!r} is not in tiers {list(tiers)}.")
    else:
        problems.add(f"{where}: 'tiers:' must be a list, but got {raw!r}.")
        tiers = ()
    if len(tiers) > 1:
        for p in params:
            if not p.tier:
                problems.add(f"param {p.name!r} has no tier while the space is staged by tiers "
                             f"{list(tiers)}; give it one of them.")
    return tiers


def _parse_pruner(where: str, raw: Any, problems: ProblemCollector) -> dict[str, float]:
    from ._pruners import pruner_options  # the options the registered pruners read (a plug-in's too)

    if not isinstance(raw, Mapping):
        problems.add(f"{where}: 'pruner:' must be a mapping (patience, min_delta), but got {raw!r}.")
        return {}
    types = pruner_options()
    pruner: dict[str, float] = {}
    for key, value in raw.items():
        num = _number(value)
        if key not in types:
            problems.add(f"{where}: pruner option {key!r} is unknown; valid: {', '.join(types)}.")
        elif num is None or num < 0:
            problems.add(f"{where}: pruner {key}={value!r} must be a number >= 0.")
        else:
            pruner[key] = float(num) if types[key] == "float" else int(num)
    return pruner


def _parse_param(name: str, spec: Any, problems: ProblemCollector) -> Param | None:
    where = f"param {name!r}"
    if not isinstance(spec, Mapping):
        problems.add(f"{where}: spec must be a mapping (type, low, high, ...), but got {spec!r}.")
        return None
    n_before = len(problems.problems)
    for key in spec:
        if key not in _PARAM_KEYS:
            problems.add(f"{where}: unknown key {key!r}; valid: {', '.join(sorted(_PARAM_KEYS))}.")
    kind = spec.get("type")
    if kind is None:
        kind = "categorical" if "choices" in spec else None
    if kind not in PARAM_TYPES:
        problems.add(f"{where}: type={kind!r} is unknown; valid: {', '.join(PARAM_TYPES)}.")
        return None
    log = spec.get("log", False)
    if not isinstance(log, bool):
        problems.add(f"{where}: log={log!r} must be true or false.")
        log = False
    when = _parse_when(where, spec.get("when"), problems)
    tier = spec.get("tier")
    common = {"when": when, "tier": str(tier) if tier is not None else None,
              "default": _scalar(spec.get("default"))}
    if kind == "categorical":
        choices = _parse_choices(where, spec, common["default"], problems)
        if choices is None or len(problems.problems) > n_before:
            return None
        return Param(name, "categorical", choices=choices, **common)
    bounds = _parse_range(where, kind, spec, log, problems)
    if bounds is None or len(problems.problems) > n_before:
        return None
    low, high, step = bounds
    return Param(name, kind, low=low, high=high, log=log, step=step, **common)


def _parse_choices(where: str, spec: Mapping[str, Any], default: Any,
                   problems: ProblemCollector) -> tuple[Any, ...] | None:
    choices = spec.get("choices")
    if not isinstance(choices, Sequence) or isinstance(choices, str):
        problems.add(f"{where}: choices={choices!r} must be a list.")
        return None
    if len(choices) == 0:
        problems.add(f"{where}: choices is empty; give at least one value.")
        return None
    choices = [_scalar(c) for c in choices]
    if len({json_dumps(c, sort_keys=True) for c in choices}) != len(choices):
        problems.add(f"{where}: choices={choices!r} has duplicates.")
    for c in choices:
        if not (c is None or isinstance(c, (bool, int, float, str))):
            problems.add(f"{where}: choice {c!r} must be a number, string, bool or null.")
    for key in ("low", "high", "step"):
        if key in spec:
            problems.add(f"{where}: {key!r} has no meaning for a categorical param.")
    if default is not None and default not in choices:
        problems.add(f"{where}: default={default!r} is not among choices {choices!r}.")
    return tuple(choices)


def _parse_range(where: str, kind: str, spec: Mapping[str, Any], log: bool,
                 problems: ProblemCollector) -> tuple[float, float, float | None] | None:
    """``(low, high, step)`` of a float or int param, every problem of them collected."""
    low, high = _number(spec.get("low")), _number(spec.get("high"))
    if low is None:
        problems.add(f"{where}: low={spec.get('low')!r} must be a number.")
    if high is None:
        problems.add(f"{where}: high={spec.get('high')!r} must be a number.")
    step = spec.get("step")
    step_num = _number(step) if step is not None else None
    if step is not None and (step_num is None or step_num <= 0):
        problems.add(f"{where}: step={step!r} must be a number > 0.")
    if "choices" in spec:
        problems.add(f"{where}: 'choices' has no meaning for type {kind}; use type categorical.")
    if low is None or high is None:
        return None
    if low > high:
        problems.add(f"{where}: low={low:g} > high={high:g}; low must be <= high.")
    if log and low <= 0:
        problems.add(f"{where}: log: true (a key of the space file) needs low > 0, but got low={low:g}.")
    if log and step_num is not None:
        problems.add(f"{where}: log: true and step: {step!r} cannot be combined; drop one.")
    if kind == "int":
        for key, v in (("low", low), ("high", high)):
            if not float(v).is_integer():
                problems.add(f"{where}: {key}={v:g} must be an integer for type int.")
        if step_num is not None and not float(step_num).is_integer():
            problems.add(f"{where}: step={step!r} must be an integer for type int.")
    return low, high, step_num


def _parse_when(where: str, raw: Any, problems: ProblemCollector) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping) or not raw:
        problems.add(f"{where}: when={raw!r} must be a mapping like {{optimizer: sgd}}.")
        return ()
    out = []
    for k, v in raw.items():
        values = tuple(_scalar(x) for x in v) if isinstance(v, (list, tuple)) else (_scalar(v),)
        out.append((str(k), values))
    return tuple(out)


def _parse_forbid(raw: Any, names: set[str], problems: ProblemCollector) -> list[ForbidRule]:
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        problems.add(f"'forbid:' must be a list of mappings like {{optimizer: sgd, lr: '>0.05'}}, but got {raw!r}.")
        return []
    rules = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not item:
            problems.add(f"forbid rule {i + 1}: {item!r} must be a non-empty mapping of param -> condition.")
            continue
        conditions: list[tuple[str, str, Any]] = []
        for name, cond in item.items():
            name = str(name)
            if name not in names:
                problems.add(f"forbid rule {i + 1}: unknown param {name!r}; known: {', '.join(sorted(names))}.")
                continue
            if isinstance(cond, (list, tuple)):
                conditions.append((name, "in", tuple(_scalar(c) for c in cond)))
                continue
            if isinstance(cond, Mapping):
                problems.add(f"forbid rule {i + 1}: {name}: {cond!r} is not a condition; valid: a value, a list "
                             "of values, or a comparison string such as '>0.05' or '!=adam'.")
                continue
            if isinstance(cond, str):
                m = _COMPARISON.match(cond)
                if m:
                    op, operand = m.group(1), m.group(2)
                    num = _number(operand)
                    if op in ("==", "!="):
                        conditions.append((name, op, _scalar(operand)))
                    elif num is None:
                        problems.add(f"forbid rule {i + 1}: {name}: {cond!r} compares with a non-number.")
                    else:
                        conditions.append((name, op, num))
                    continue
            conditions.append((name, "==", _scalar(cond)))
        if conditions:
            rules.append(ForbidRule(tuple(conditions)))
    return rules


def _check_cycles(params: list[Param], problems: ProblemCollector) -> None:
    """A param's condition must refer to params listed before it (values are chosen in order)."""
    seen: set[str] = set()
    for p in params:
        for other, _ in p.when:
            if other != p.name and other not in seen and any(q.name == other for q in params):
                problems.add(f"param {p.name!r}: 'when' refers to {other!r}, which is listed after it; "
                             "list the params a condition depends on first.")
        seen.add(p.name)
