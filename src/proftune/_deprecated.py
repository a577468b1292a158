"""The lifecycle of public API: former names that keep working, and what is still experimental.

Each thing has one name (``TrainResult``, ``proftune.compress.QUANT_BACKENDS``,
``proftune.search.feasibility_scan``) and one home (``proftune.predict``); a former name is
served by the module's ``__getattr__`` (PEP 562), is not in ``__all__`` and warns once per place
it is used, naming the version it was deprecated in and the one that removes it (two minor
versions later, as Optuna does); :func:`warn_deprecated` says the same of a deprecated attribute
or argument. :func:`experimental` marks a function or class whose interface may still change
(:func:`warn_experimental` a use of one that is a mode of a stable function, such as a plain
objective given to ``proftune.search``): it warns with :class:`ExperimentalWarning` once per
process, naming the version it came in. The CLI hides both, as every library warning, unless
``--debug`` (``cli._common.library_warnings``).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["DEPRECATED_IN", "ExperimentalWarning", "experimental", "removal_version", "renamed", "warn_deprecated",
           "warn_experimental"]

#: The version the current former names were deprecated in.
DEPRECATED_IN = "0.1.0"

F = TypeVar("F", bound=Callable[..., Any])


class ExperimentalWarning(UserWarning):
    """An experimental interface was used: it may change without a deprecation period."""


def removal_version(deprecated: str) -> str:
    """The version that removes what ``deprecated`` deprecated: two minor versions later."""
    major, minor, *_ = (int(x) for x in deprecated.split("."))
    return f"{major}.{minor + 2}.0"


#: The experimental interfaces that warned in this process (each warns once).
_WARNED: set[str] = set()


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _user_level() -> int:
    """The ``stacklevel`` (for a ``warnings.warn`` in the caller) of the first frame outside
    proftune: the warning names the user's line, however many of our frames lie between."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def warn_experimental(label: str, version: str) -> None:
    """Warn, once per process, that ``label`` is experimental since ``version``."""
    if label in _WARNED:
        return
    _WARNED.add(label)
    warnings.warn(f"{label} is experimental (since {version}): its interface may change without a "
                  "deprecation period.", ExperimentalWarning, stacklevel=_user_level())


def warn_deprecated(what: str, *, use: str, deprecated: str = DEPRECATED_IN) -> None:
    """A DeprecationWarning that ``what`` is deprecated for ``use``, naming the version that
    deprecated it and the one that removes it."""
    warnings.warn(f"{what} is deprecated; use {use}. Deprecated in {deprecated}, to be removed in "
                  f"{removal_version(deprecated)}.", DeprecationWarning, stacklevel=_user_level())


def experimental(version: str, *, name: str | None = None) -> Callable[[F], F]:
    """Mark a function or class as experimental since ``version``: its first use warns once."""

    def deco(obj: F) -> F:
        label = name or str(getattr(obj, "__qualname__", repr(obj)))

        def warn() -> None:
            warn_experimental(label, version)

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
    removal_version(deprecated)  # a malformed version fails here, at import, not at the first use

    def __getattr__(name: str) -> Any:
        if name in former:
            where, current = home or module, former[name]
            warn_deprecated(f"{module}.{name}", use=f"{where}.{current} (the same object)", deprecated=deprecated)
            return getattr(importlib.import_module(where), current)
        if fallback is not None:
            return fallback(name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
