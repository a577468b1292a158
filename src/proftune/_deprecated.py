"""Former public names that keep working, with a ``DeprecationWarning`` naming the one to use.

Each thing has one name (``TrainResult``, ``proftune.compress.QUANT_BACKENDS``,
``proftune.search.feasibility_scan``) and one home (``proftune.predict``); a former name is
served by the module's ``__getattr__`` (PEP 562), is not in ``__all__`` and warns once per place
it is used.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["renamed"]


def renamed(module: str, former: Mapping[str, str], *, home: str | None = None,
            fallback: Callable[[str], Any] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving each name of ``former`` (former name -> its current name)
    as the object of the current name, with a DeprecationWarning naming it; any other name goes
    to ``fallback`` or is an AttributeError. The current names are in ``module``, or in ``home``
    for names that moved (``proftune.predict``)."""

    def __getattr__(name: str) -> Any:
        if name in former:
            where, current = home or module, former[name]
            warnings.warn(f"{module}.{name} is deprecated; use {where}.{current} (the same object).",
                          DeprecationWarning, stacklevel=2)
            return getattr(importlib.import_module(where), current)
        if fallback is not None:
            return fallback(name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
