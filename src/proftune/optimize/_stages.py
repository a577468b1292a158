"""The optimize loop's stages: each a registered :class:`BaseStage` with its name, its share of the
budget, its typed output record and its resume check; the loop runs them in their order.

A built-in stage registers exactly as a user's does (``@register_stage``, or the
``proftune.optimize_stages`` entry point group). A stage says where it runs with ``after`` (the
stage it follows; none: at the end). ``OPTIMIZE_STAGES``, ``SHARES`` and ``STAGE_RECORDS`` are read
from the registry, so a new stage is one class and its registration.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .._registry import LiveSequence, Registry
from ..exceptions import ConfigError
from ._records import StageOutputs

if TYPE_CHECKING:
    from ._context import StageContext

__all__ = ["OPTIMIZE_STAGES", "SHARES", "STAGE_RECORDS", "STAGE_REGISTRY", "BaseStage", "StageResult",
           "register_stage", "stage_order"]


@dataclass
class StageResult:
    """What a stage's ``run`` returns: its record, and the metric before and after it (the
    stage table's "before -> after"), and its status (``finished`` or ``skipped``)."""

    outputs: StageOutputs
    before: float | None = None
    after: float | None = None
    status: str = "finished"


class BaseStage(abc.ABC):
    """One stage of the optimize loop.

    ``run(loop, share, end)`` does the stage's work in about ``share`` seconds (``end`` is
    ``time.monotonic()`` by which it should be done) and returns its record. ``loop`` is a
    :class:`StageContext`, the public contract a stage relies on: the task (its validation data
    split for held-out figures), the defaults, the options (``loop.cfg``, ``loop.v``), the Store,
    the state of the stages before it (``loop.state.record(TheirOutputs)``), the clock
    (``loop.budget``), the plan of the budget (``loop.planner.budget_plan()``), the output folder
    (``loop.out``) and ``loop.say(event, data)`` for progress.
    """

    #: The stage's name (in the Store, ``--json`` and the report).
    name: ClassVar[str] = ""
    #: Its share of the budget; what a stage leaves unspent goes to the stages after it.
    share: ClassVar[float] = 0.0
    #: Its output record (a :class:`StageOutputs` subclass whose ``STAGE`` is ``name``).
    record: ClassVar[type[StageOutputs]] = StageOutputs
    #: The stage it runs after (None: after every stage registered before it).
    after: ClassVar[str | None] = None
    #: What its "before -> after" compares, for the stage table (None: it has no metric).
    compares: ClassVar[str | None] = None
    #: The fields of its record that name a file in the output folder (checked on resume).
    file_fields: ClassVar[tuple[str, ...]] = ("model", "profile", "trials_file", "output")

    @abc.abstractmethod
    def run(self, loop: StageContext, share: float, end: float) -> StageResult:
        """Do the stage's work and return its record."""

    def skipped(self, loop: StageContext) -> bool:
        """Whether the stage's work is off with these options: its share goes to the others (its
        ``run`` is still called, and returns its record with status ``skipped`` and why)."""
        return False

    def missing_files(self, outputs: Mapping[str, Any], out: Path) -> list[str]:
        """The files a finished run of the stage claims (in ``outputs``) that are not in ``out``: on
        resume, such a stage runs again."""
        return [str(outputs[k]) for k in self.file_fields
                if isinstance(outputs.get(k), str) and outputs[k] and not (out / str(outputs[k])).is_file()]

    def on_end(self, loop: StageContext) -> None:  # noqa: B027  (an optional hook, a no-op by default)
        """Called after the stage finished and its record is saved."""


#: Every stage, by name.
STAGE_REGISTRY: Registry[BaseStage] = Registry(
    "optimize stage", key=lambda s: s.name, entry_points="proftune.optimize_stages")

S = TypeVar("S")
V = TypeVar("V")


def register_stage(stage: S) -> S:
    """Register a :class:`BaseStage` subclass (built with no arguments) or instance; usable as a
    class decorator. Its name must be new, its ``after`` a registered stage, its record a
    :class:`StageOutputs` whose ``STAGE`` is its name. The loop calls its ``run`` with a
    :class:`StageContext` (``proftune.optimize.StageContext``); the built-in stages register here
    too, and an installed package's through the ``proftune.optimize_stages`` entry point group."""
    obj: Any = stage() if isinstance(stage, type) else stage
    problems: list[str] = []
    if not isinstance(obj, BaseStage):
        raise ConfigError(f"stage={stage!r} is not a proftune.optimize.BaseStage.")
    cls = type(obj).__name__
    if not isinstance(obj.name, str) or not obj.name:
        problems.append(f"{cls}.name must be a non-empty string, but got {obj.name!r}.")
    if not (isinstance(obj.record, type) and issubclass(obj.record, StageOutputs)) or obj.record.STAGE != obj.name:
        problems.append(f"{cls}.record must be a StageOutputs subclass whose STAGE is {obj.name!r}, "
                        f"but got {obj.record!r}.")
    if isinstance(obj.share, bool) or not isinstance(obj.share, (int, float)) or not 0 <= obj.share <= 1:
        problems.append(f"{cls}.share must be a share of the budget in [0, 1], but got {obj.share!r}.")
    if obj.after is not None and obj.after not in STAGE_REGISTRY:
        problems.append(f"{cls}.after={obj.after!r} is no registered stage; valid: "
                        f"{', '.join(STAGE_REGISTRY.names())} (or None: at the end).")
    if problems:
        raise ConfigError(problems)
    STAGE_REGISTRY.add(obj, origin=stage)
    return stage


# An installed stage (the ``proftune.optimize_stages`` entry point group) passes the same checks.
STAGE_REGISTRY.loads_through(register_stage)


def stage_order() -> tuple[str, ...]:
    """The stages in the order they run: registration order, each one with ``after`` placed right
    behind that stage (and behind the stages placed there before it)."""
    order: list[str] = []
    for name in STAGE_REGISTRY:
        after = STAGE_REGISTRY[name].after
        if after is None or after not in order:
            order.append(name)
            continue
        i = order.index(after) + 1
        while i < len(order) and STAGE_REGISTRY[order[i]].after == after:
            i += 1
        order.insert(i, name)
    return tuple(order)


def stages() -> list[BaseStage]:
    """The registered stages, in the order they run."""
    return [STAGE_REGISTRY[n] for n in stage_order()]


class _Live(Mapping[str, V]):
    """A read-only mapping over the stages, read from the registry on every access."""

    def __init__(self, field: str) -> None:
        self._field = field

    def _read(self) -> dict[str, V]:
        return {s.name: getattr(s, self._field) for s in stages()}

    def __getitem__(self, name: str) -> V:
        return self._read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())

    def __repr__(self) -> str:
        return repr(self._read())


#: The stages, in the order they run (names in the Store and in ``--json``).
OPTIMIZE_STAGES = LiveSequence(stage_order)
#: Each stage's share of the total budget.
SHARES: Mapping[str, float] = _Live[float]("share")
#: Each stage's output record.
STAGE_RECORDS: Mapping[str, type[StageOutputs]] = _Live[type[StageOutputs]]("record")
