"""The registry of diagnosis checks, keyed by the cause each names: the one list that ``CHECKS``,
``CAUSES`` and which cause explains which are read from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from .._registry import Registry
from ..exceptions import ConfigError

if TYPE_CHECKING:
    from .checks._base import BaseCheck

__all__ = ["CHECK_REGISTRY", "register_check"]

#: Every check, by its cause, in the order they run (and that settles ties in the ranking).
CHECK_REGISTRY: Registry[BaseCheck] = Registry(
    "diagnosis check", key=lambda c: c.cause, entry_points="proftune.checks")

C = TypeVar("C")


def register_check(check: C) -> C:
    """Register a :class:`BaseCheck` subclass (built with no arguments) or instance; usable as a
    class decorator. Its ``cause`` becomes a valid cause and its ``explains`` say which other
    causes' findings a finding of it accounts for."""
    from .checks._base import BaseCheck

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
