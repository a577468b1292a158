"""The registry of diagnosis checks, keyed by the cause each names: the one list that ``CHECKS``,
``CAUSES`` and which cause explains which are read from.

It sits below the checks (a finding's cause is checked against it, and a check returns findings):
it knows a check only as its ``cause`` and ``explains``; ``checks/_base.py`` registers them."""

from __future__ import annotations

from typing import ClassVar, Protocol

from .._registry import Registry

__all__ = ["CHECK_REGISTRY", "CheckEntry"]


class CheckEntry(Protocol):
    """What the registry reads of a check (``checks.BaseCheck`` is the class a check subclasses)."""

    cause: ClassVar[str]
    explains: ClassVar[tuple[str, ...]]


#: Every check, by its cause, in the order they run (and that settles ties in the ranking).
CHECK_REGISTRY: Registry[CheckEntry] = Registry(
    "diagnosis check", key=lambda c: c.cause, entry_points="proftune.checks")
