"""The extension point of diagnose: one check per cause of bad training."""

from __future__ import annotations

import abc
from typing import Any, ClassVar, TypeVar

from ...exceptions import ConfigError
from .._causes import CHECK_REGISTRY
from .._findings import Finding
from .._history import History

__all__ = ["BaseCheck", "fmt", "register_check"]

C = TypeVar("C")


class BaseCheck(abc.ABC):
    """Reads a run's :class:`History` and names one cause when its evidence is there.

    A new cause is one subclass registered with :func:`proftune.diagnose.register_check` (a
    class decorator, or an entry point in the group ``proftune.checks``): its ``cause`` joins
    ``CAUSES`` and it runs with ``CHECKS``. A check marks its finding ``root=True`` when the
    evidence shows a root cause of this run (it then explains other findings regardless of their
    confidence).
    """

    #: The cause this check reports; registering the check makes it one of ``CAUSES``.
    cause: ClassVar[str]
    #: The causes whose findings a finding of this one accounts for when it started no later than
    #: they did (or is a root cause): the symptoms this cause can produce.
    explains: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def check(self, history: History) -> Finding | None:
        """The finding for this cause, or None when the run shows no sign of it."""


def register_check(check: C) -> C:
    """Register a :class:`BaseCheck` subclass (built with no arguments) or instance; usable as a
    class decorator. Its ``cause`` becomes a valid cause and its ``explains`` say which other
    causes' findings a finding of it accounts for."""
    obj: Any = check() if isinstance(check, type) else check
    problems = []
    if not isinstance(obj, BaseCheck):
        problems.append(f"check={check!r} is not a proftune.diagnose.BaseCheck.")
    else:
        if not isinstance(getattr(obj, "cause", None), str) or not obj.cause:
            problems.append(f"{type(obj).__name__}.cause must be a non-empty string, "
                            f"but got {getattr(obj, 'cause', None)!r}.")
        explains = getattr(obj, "explains", ())
        if not isinstance(explains, tuple) or not all(isinstance(c, str) for c in explains):
            problems.append(f"{type(obj).__name__}.explains must be a tuple of cause names, "
                            f"but got {explains!r}.")
    if problems:
        raise ConfigError(problems)
    CHECK_REGISTRY.add(obj, origin=check)
    return check


CHECK_REGISTRY.loads_through(register_check)


def fmt(x: float) -> str:
    """A number as a reader wants it in a summary: three significant digits."""
    return f"{x:.3g}"
