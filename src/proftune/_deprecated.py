"""The lifecycle of public API: former names that keep working, and what is still experimental.

Each thing has one name (``TrainResult``, ``proftune.compress.QUANT_BACKENDS``,
``proftune.search.feasibility_scan``) and one home (``proftune.predict``); a former name is
served by the module's ``__getattr__`` (PEP 562), is not in ``__all__`` and warns once per place
it is used, naming the version it was deprecated in and the one that removes it (two minor
versions later, as Optuna does). :func:`experimental` marks a function or class whose interface
may still change: it warns with :class:`ExperimentalWarning` once, naming the version it came in.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["DEPRECATED_IN", "ExperimentalWarning", "experimental", "removal_version", "renamed"]

#: The version the current former names were deprecated in.
DEPRECATED_IN = "0.1.0"

F = TypeVar("F", bound=Callable[..., Any])


class ExperimentalWarning(UserWarning):
    """An experimental interface was used: it may change without a deprecation period."""


def removal_version(deprecated: str) -> str:
    """The version that removes what ``deprecated`` deprecated: two minor versions later."""
    major, minor, *_ = (int(x) for x in deprecated.split("."))
    return f"{major}.{minor + 2}.0"


def experimental(version: str, *, name: str | None = None) -> Callable[[F], F]:
    """Mark a function or class as experimental since ``version``: its first use warns once."""

    def deco(obj: F) -> F:
        label = name or getattr(obj, "__qualname__", repr(obj))
        warned = False

        def warn() -> None:
            nonlocal warned
            if not warned:
                warned = True
                warnings.warn(f"{label} is experimental (since {version}): its interface may change "
                              "without a deprecation period.", ExperimentalWarning, stacklevel=3)

        if isinstance(obj, type):
            init = obj.__init__  # type: ignore[misc]

            @functools.wraps(init)
            def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
                warn()
                init(self, *args, **kwargs)

            obj.__init__ = __init__  # type: ignore[misc]
            return obj

        @functools.wraps(obj)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warn()
            return obj(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


def renamed(module: str, former: Mapping[str, str], *, home: str | None = None,
            fallback: Callable[[str], Any] | None = None,
            deprecated: str = DEPRECATED_IN) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each name of ``former`` (former name -> its current name)
    as the object of the current name, with a DeprecationWarning naming it; any other name goes
    to ``fallback`` or is an AttributeError. The current names are in ``module``, or in ``home``
    for names that moved (``proftune.predict``). The warning names the version ``deprecated``
    and the one that removes the former name (:func:`removal_version`)."""
    removed = removal_version(deprecated)

    def __getattr__(name: str) -> Any:
        if name in former:
            where, current = home or module, former[name]
            warnings.warn(f"{module}.{name} is deprecated; use {where}.{current} (the same object). "
                          f"Deprecated in {deprecated}, to be removed in {removed}.",
                          DeprecationWarning, stacklevel=2)
            return getattr(importlib.import_module(where), current)
        if fallback is not None:
            return fallback(name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
