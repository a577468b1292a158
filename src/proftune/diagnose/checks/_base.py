"""The extension point of diagnose: one check per cause of bad training."""

from __future__ import annotations

import abc
from typing import ClassVar

from .._findings import Finding
from .._history import History

__all__ = ["BaseCheck", "fmt"]


class BaseCheck(abc.ABC):
    """Reads a run's :class:`History` and names one cause when its evidence is there.

    A new cause is one new module with a subclass, added to ``CHECKS`` in ``checks/__init__.py``
    (and its name to ``CAUSES``). A check marks its finding ``root=True`` when the evidence shows
    a root cause of this run (it then explains other findings regardless of their confidence).
    """

    #: The cause this check reports (one of :data:`proftune.diagnose.CAUSES`).
    cause: ClassVar[str]

    @abc.abstractmethod
    def check(self, history: History) -> Finding | None:
        """The finding for this cause, or None when the run shows no sign of it."""


def fmt(x: float) -> str:
    """A number as a reader wants it in a summary: three significant digits."""
    return f"{x:.3g}"
