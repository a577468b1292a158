"""The search stage's space: the wide space handed to ``proftune.search``, and the narrow
ranges around the computed centre that 70% of the trials sample from."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._optimizers import DEFAULT_LR, default_weight_decay
from .._records import JsonRecord, Reader
from ..exceptions import ProblemCollector
from ..search import Param, Space, load_space
from ..task import Task
from ..train import LOOP_PARAMS
from ._computed import ComputedValues

__all__ = ["SearchPlan", "build_plan", "in_space", "task_param_defaults"]

#: Loop params the compute stage fixes (never searched by default).
COMPUTED_FIXED = ("grad_accumulation", "precision")
#: Batches the search's space holds whatever the computed centre (within what fits and the data).
COMMON_BATCHES = (16, 32, 64, 128, 256)


class _DefaultProbe(dict[str, Any]):
    """A params dict that notes which keys a task reads, and the default it reads them with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.defaults: dict[str, Any] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        if isinstance(key, str) and key not in self.defaults:
            self.defaults[key] = super().get(key, default)
        return super().get(key, default)


def task_param_defaults(task: Task) -> dict[str, Any]:
    """Params the task reads while building its model and data, with the value each defaults to."""
    probe = _DefaultProbe(task.default_params)
    try:
        task.build_model(probe)
        task.train_data(int(task.default_params.get("batch_size", 32)), probe)
    except Exception:  # noqa: BLE001 - a task that cannot build from defaults fails loudly in the baseline stage
        return dict(task.default_params)
    return {**probe.defaults, **task.default_params}


@dataclass(frozen=True)
class SearchPlan(JsonRecord):
    """The wide space (what the study stores), the computed centre and the narrow ranges."""

    WHAT: ClassVar[str] = "a search plan"
    READERS: ClassVar[dict[str, Reader]] = {"space": Space.from_dict}

    space: Space
    centre: dict[str, object]
    #: name -> (low, high) for numeric params, or a list of choices for categorical ones.
    narrow: dict[str, Sequence[object]]
    evidence: dict[str, str] = field(default_factory=dict)


def _log_range(centre: float, factor: float, low: float, high: float) -> tuple[float, float]:
    return max(low, centre / factor), min(high, centre * factor)


def _default_space(task: Task, computed: ComputedValues, *, max_batch: int | None,
                   samples: int | None, roomy: bool = False
                   ) -> tuple[dict[str, Any], dict[str, object], dict[str, Sequence[object]], dict[str, str]]:
    """(space dict, centre, narrow, evidence) over the params the fit loop and the task read.

    Every range holds the task's default value too, so that the defaults are a point of the
    space (the search measures them under its protocol, and nothing is worse than them there).
    """
    defaults = task_param_defaults(task)
    params: dict[str, Any] = {}
    centre: dict[str, object] = {}
    narrow: dict[str, Sequence[object]] = {}
    evidence: dict[str, str] = {}
    lr = float(computed.lr or defaults.get("lr") or DEFAULT_LR)
    # a measured rate is searched within 30x; without one (the range test found none, or had no
    # time) the task's rate may be off by far more: three decades each way
    lo, hi = _log_range(lr, 30.0 if computed.lr else 1000.0, 1e-6, 3.0)
    if isinstance(defaults.get("lr"), (int, float)) and float(defaults["lr"]) > 0:
        lo, hi = min(lo, float(defaults["lr"])), max(hi, float(defaults["lr"]))
    params["lr"] = {"type": "float", "low": lo, "high": hi, "log": True}
    centre["lr"], narrow["lr"] = lr, _log_range(lr, 3.0, lo, hi)
    evidence["lr"] = "computed (LR range test, scaled to the batch)" if computed.lr else "task default"
    bs = int(computed.batch_size or defaults.get("batch_size") or 32)
    cap = min(x for x in (max_batch, samples, 4096) if x)
    default_bs = int(defaults.get("batch_size") or bs)
    # an eighth to eight times the computed batch: a batch computed from the noise scale can leave
    # a small dataset a handful of steps per epoch, and on a few dozen samples the whole training
    # set in one step (capped there) can be the best (few-shot digits: batch 50 of 50 at test
    # 0.80 against 0.77 at 16 and below)
    # and, whatever the centre, batches that leave eight and 32 steps an epoch: a default batch
    # beyond the data (8192 on 3,196 samples) made every choice one or two steps an epoch, so
    # the search could not reach the batch of 64 a plain loop found (issue 60's generated tasks)
    reach = (samples // 8, samples // 32) if samples else ()
    # and the batches a plain loop searches whatever the centre (a centre of a whole 1,097-sample set
    # in one step kept the search at 128 and above, where a plain loop's best was 32)
    # and none under a quarter of the task's own batch (unless the computed batch, whose cost was
    # checked, or the batch that leaves eight steps an epoch is there): an epoch at an eighth of it
    # takes eight times the steps, and where a step costs its overhead more than its samples (a
    # small model) eight times the time: on a 54-sample GRU one quasi-random point at batch 2 took
    # 6x the defaults' training, a third of an 8-training budget's search (issue 60's generated tasks)
    # ``roomy`` (the budget holds many full trainings): the cost of a few small-batch trials is a few
    # of many, and the plain loop's batches from 16 are choices too (a 1-epoch CNN whose own batch of
    # 128 left 6 steps an epoch learned only at 16: 0.84 on test against 0.31 from 32 up)
    floor = max(2, min(default_bs // 4, bs, *((samples // 8,) if samples else ()),
                       *((COMMON_BATCHES[0],) if roomy else ())))
    choices = sorted({max(floor, min(cap, b)) for b in (bs // 8, bs // 4, bs // 2, bs, bs * 2, bs * 4, bs * 8,
                                                       min(cap, default_bs), *reach, *COMMON_BATCHES)})
    params["batch_size"] = {"type": "categorical", "choices": choices}
    centre["batch_size"] = min(bs, cap)
    if samples and samples // 8 >= 2 and min(bs, cap) >= samples:
        # a centre of the whole set in one step (a default beyond the data, capped there) moves to
        # the largest batch of the space that leaves eight steps an epoch (a few dozen samples in one
        # step can be the best: it stays a choice)
        centre["batch_size"] = max(c for c in choices if c <= samples // 8)
    narrow["batch_size"] = [c for c in choices if bs // 2 <= c <= bs * 2]
    evidence["batch_size"] = "computed (memory budget / critical batch)" if computed.batch_size else "task default"
    if str(defaults.get("optimizer", "adamw")) in ("adamw", "adam", "sgd"):
        own = defaults.get("weight_decay")
        # unset: what the fit loop's optimizer applies (SGD none, AdamW 0.01): a fit-loop SGD task was
        # centred at 0.01 of decay it never had, and "what changed" listed it
        wd = default_weight_decay(str(defaults.get("optimizer", "adamw"))) if own is None else float(own)
        # a decay of 0 the task gives is its choice: the centre is the space's floor (1e-6, no decay to
        # speak of on a log scale), not AdamW's 0.01 (a task whose own SGD had none was centred at 0.01)
        low = min(1e-6, wd) if wd > 0 else 1e-6
        wd = max(wd, low)
        params["weight_decay"] = {"type": "float", "low": low, "high": max(0.3, wd), "log": True}
        centre["weight_decay"], narrow["weight_decay"] = wd, _log_range(wd, 10.0, low, 0.3)
        evidence["weight_decay"] = "task default (the fit loop's optimizer's when unset)"
    for name, value in sorted(defaults.items()):
        if name in LOOP_PARAMS or name in params or isinstance(value, bool):
            continue
        if "dropout" in name and isinstance(value, (int, float)):
            d = float(value)
            params[name] = {"type": "float", "low": 0.0, "high": max(0.5, d)}
            centre[name], narrow[name] = d, (max(0.0, d - 0.1), min(0.5, d + 0.15))
            evidence[name] = "task default"
        elif isinstance(value, int) and value >= 4:
            lo_i, hi_i = max(1, value // 2), value * 2
            params[name] = {"type": "int", "low": lo_i, "high": hi_i, "log": True}
            centre[name], narrow[name] = value, (max(lo_i, round(value * 0.75)), min(hi_i, round(value * 1.5)))
            evidence[name] = "task default (architecture)"
    fixed = {k: v for k, v in computed.params().items() if k in COMPUTED_FIXED}
    alt = computed.optimizer_alternative
    own = str(defaults.get("optimizer", "adamw"))
    if alt is not None and alt.optimizer != own:
        # the optimizer row measured another optimizer better: both are searched, the lr range
        # covers both rates, SGD's momentum where SGD is drawn
        params["optimizer"] = {"type": "categorical", "choices": [own, alt.optimizer]}
        centre["optimizer"], narrow["optimizer"] = own, [own, alt.optimizer]
        evidence["optimizer"] = f"computed (the optimizer row: {alt.optimizer} beat {own} at equal time)"
        params["lr"]["low"] = min(params["lr"]["low"], alt.lr / 30)
        params["lr"]["high"] = max(params["lr"]["high"], alt.lr * 30)
        if "sgd" in (own, alt.optimizer):
            params["momentum"] = {"type": "float", "low": 0.0, "high": 0.99, "when": {"optimizer": "sgd"}}
            momentum = alt.momentum if alt.momentum is not None else defaults.get("momentum", 0.9)
            centre["momentum"] = float(momentum or 0.9)
            narrow["momentum"] = (0.5, 0.99)
    elif "optimizer" in defaults:
        fixed["optimizer"] = defaults["optimizer"]
    return {"params": params, "fixed": fixed}, centre, narrow, evidence


def _user_plan(space: Space, computed: ComputedValues, problems: ProblemCollector, *,
               max_batch: int | None) -> tuple[Space, dict[str, object], dict[str, Sequence[object]], dict[str, str]]:
    if space.tiers:
        space = dataclasses.replace(space, tiers=())  # optimize draws whole configurations
    values = computed.params()
    for key in COMPUTED_FIXED:
        if key in space.fixed and values.get(key) is not None and space.fixed[key] != values[key]:
            problems.add(f"space= fixes {key}={space.fixed[key]!r}, but the compute stage measured "
                         f"{key}={values[key]!r}; remove it from the space or make them agree.")
    if max_batch is not None:
        fixed_bs = space.fixed.get("batch_size")
        if fixed_bs is not None and int(fixed_bs) > max_batch:
            problems.add(f"space= fixes batch_size={fixed_bs}, above the largest batch that fits "
                         f"memory_budget= ({max_batch}, measured).")
        if "batch_size" in space.names:
            p = space.param("batch_size")
            smallest = min(p.choices) if p.type == "categorical" else p.low
            if smallest is not None and float(smallest) > max_batch:
                problems.add(f"space= batch_size starts at {smallest}, above the largest batch that "
                             f"fits memory_budget= ({max_batch}, measured).")
    centre: dict[str, object] = {}
    narrow: dict[str, Sequence[object]] = {}
    evidence: dict[str, str] = {}
    for p in space.params:
        c = values.get(p.name)  # a param of the user's space, by its name
        centre[p.name] = in_space(p, c) if c is not None else p.center()
        evidence[p.name] = "computed (centre)" if c is not None else "the given space (centre of the range)"
        narrow[p.name] = _narrow(p, centre[p.name])
    return space, centre, narrow, evidence


def in_space(p: Param, value: Any) -> Any:
    """``value`` as a legal value of ``p`` (snapped into its range, or the nearest choice)."""
    if p.type == "categorical":
        if value in p.choices:
            return value
        numeric = [c for c in p.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        if numeric and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return min(numeric, key=lambda c: abs(math.log(max(c, 1e-12)) - math.log(value)))
        return p.choices[0]
    return p.snap(float(value))


def _narrow(p: Param, centre: Any) -> Any:
    if p.type == "categorical":
        choices = list(p.choices)
        i = choices.index(centre) if centre in choices else 0
        return choices[max(0, i - 1): i + 2]
    assert p.low is not None
    assert p.high is not None
    if p.log:
        return (max(p.low, float(centre) / 3.0), min(p.high, float(centre) * 3.0))
    width = (p.high - p.low) * 0.15
    return (max(p.low, float(centre) - width), min(p.high, float(centre) + width))


def build_plan(task: Task, computed: ComputedValues | Mapping[str, Any], *,
               user_space: str | Mapping[str, Any] | None, max_batch: int | None, samples: int | None,
               roomy: bool = False) -> SearchPlan:
    """The search plan from the compute stage's values (its record, or the record's JSON); a user
    space that contradicts them is a :class:`ConfigError` naming every contradiction. ``roomy``: the
    budget holds many full trainings (the default space's batches reach down to a plain loop's)."""
    if not isinstance(computed, ComputedValues):
        computed = ComputedValues.from_dict(computed)
    problems = ProblemCollector()
    if user_space is None:
        raw, centre, narrow, evidence = _default_space(task, computed, max_batch=max_batch, samples=samples,
                                                        roomy=roomy)
        space = load_space(raw)
    else:
        space, centre, narrow, evidence = _user_plan(load_space(user_space), computed, problems,
                                                     max_batch=max_batch)
    problems.raise_if_any(header="optimize: the search space contradicts the computed values:")
    return SearchPlan(space=space, centre=centre, narrow=narrow, evidence=evidence)
