"""Former public names that keep working, with a ``DeprecationWarning`` naming the one to use.

Each result kind has one name (``TrainResult``, ``DiagnoseResult``, ``BanditResult``); a former
name is served by the module's ``__getattr__`` (PEP 562), is not in ``__all__`` and warns once
per place it is used.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["renamed"]


def renamed(module: str, former: Mapping[str, Any], *, home: str | None = None,
            fallback: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each name of ``former`` (former name -> the object under
    its current name) with a DeprecationWarning; any other name goes to ``fallback`` or is an
    AttributeError. ``home``: the names moved, unrenamed, to that module (``proftune.predict``)."""

    def __getattr__(name: str) -> Any:
        if name in former:
            obj = former[name]
            current = f"{home}.{name}" if home else f"{module}.{obj.__name__}"
            warnings.warn(f"{module}.{name} is deprecated; use {current} (the same object).",
                          DeprecationWarning, stacklevel=2)
            return obj
        if fallback is not None:
            return fallback(name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
