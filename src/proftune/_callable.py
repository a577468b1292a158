"""A subpackage that is also its main function: one object per name.

``proftune.profile`` is the subpackage: ``import proftune.profile as m``, ``from proftune.profile
import Profile`` and ``mock.patch("proftune.profile._timing.X")`` all reach the module. Called,
``proftune.profile(task, ...)`` runs the subpackage's function of the same name
(``proftune.profile.profile``), looked up on each call (so patching that function patches the
call too); ``inspect.signature`` and ``help`` show that function's signature and docstring.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

__all__ = ["CallableModule", "make_callable"]


def _function(module: types.ModuleType) -> Callable[..., Any]:
    """The module's function of its own (last) name: ``proftune.compress.compress``."""
    function: Callable[..., Any] = module.__dict__[module.__name__.rpartition(".")[2]]
    return function


class CallableModule(types.ModuleType):
    """A module whose call is its function of the same name."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _function(self)(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(_function(self))

    def __reduce__(self) -> tuple[Callable[[str], types.ModuleType], tuple[str]]:
        # pickled by name like a function (a process pool, Ray): unpickled, it is this module again
        return importlib.import_module, (self.__name__,)


def make_callable(name: str) -> None:
    """Make the module ``name`` (a subpackage's ``__name__``, at the end of its ``__init__``)
    callable as its function of the same name, and add that function's signature and docstring
    to the module's docstring (what ``help`` shows first)."""
    module = sys.modules[name]
    short = name.rpartition(".")[2]
    function = module.__dict__.get(short)
    if not callable(function):
        raise TypeError(f"module {name!r} has no function {short!r} to be called as")
    module.__class__ = CallableModule
    sig = inspect.signature(function)
    bare = sig.replace(parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
                       return_annotation=sig.empty)
    call = f"Called, ``{name}{bare}`` runs :func:`{short}`:"
    module.__doc__ = "\n\n".join(part for part in ((module.__doc__ or "").rstrip(), call,
                                                   inspect.getdoc(function) or "") if part)
