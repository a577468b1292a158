"""A public function's options as one frozen config dataclass, its fields also given by name.

``fn(task, params, config, **options)``: ``config`` (or the dataclass's defaults) with
``options`` set. A name the dataclass lacks is a ConfigError listing the valid ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from .exceptions import ConfigError

__all__ = ["with_options"]

C = TypeVar("C")


def with_options(cls: type[C], config: C | None, options: Mapping[str, Any], *, caller: str) -> C:
    """``config`` (default ``cls()``) with ``options`` set by name; ``caller`` names the function."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(options) - names)
    if unknown:
        raise ConfigError(f"{caller}() got unknown options {unknown}; valid: {', '.join(sorted(names))}.")
    if config is not None and not isinstance(config, cls):
        raise ConfigError(f"{caller}() takes a {cls.__name__} as config, but got {type(config).__name__}.")
    base = config if config is not None else cls()
    return dataclasses.replace(base, **options)  # type: ignore[type-var]
