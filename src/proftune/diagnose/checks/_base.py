"""The extension point of diagnose: one check per cause of bad training."""

from __future__ import annotations

import abc
from typing import ClassVar

from .._findings import Finding
from .._history import History

__all__ = ["BaseCheck", "fmt"]


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


def fmt(x: float) -> str:
    """A number as a reader wants it in a summary: three significant digits."""
    return f"{x:.3g}"
