"""Reading a result record back from its JSON (a Run's result, a saved file): one policy.

A result kind is a frozen dataclass with ``schema_version``, ``to_dict`` and ``from_dict``; its
``from_dict`` reads through :func:`stored_version` and :func:`record_fields`, so that every kind
treats versions and keys alike:

- no ``schema_version``: version 1 (the Run was recorded before records carried one);
- a version above the reader's: a :class:`ConfigError` naming both (upgrade proftune);
- a key that is not a field of the record (nor one of the values its ``to_dict`` derives): a
  :class:`ConfigError` naming it, so a field a producer renamed fails when read instead of
  rendering as a blank; a missing field without a default fails too. A missing field that has a
  default reads as the default (a record of the same version written before the field existed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from .exceptions import ConfigError

__all__ = ["record_fields", "stored_version"]


def stored_version(d: Any, *, what: str, current: int) -> int:
    """The ``schema_version`` of the record ``d`` (1 when it has none); ``what`` names the kind
    in the errors (``"a batch-size search"``). Not a JSON object, not a version, or newer than
    ``current``: :class:`ConfigError`."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{what} must be a JSON object, but got {type(d).__name__}.")
    version = d.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"{what} has schema_version={version!r}; a version is an integer >= 1.")
    if version > current:
        readable = "1" if current == 1 else f"1 to {current}"
        raise ConfigError(f"{what} has schema_version={version}, newer than this proftune reads "
                          f"(schema_version {readable}); upgrade proftune.")
    return version


def record_fields(cls: type, d: Mapping[str, Any], *, what: str, derived: Iterable[str] = (),
                  exclude: Iterable[str] = ()) -> dict[str, Any]:
    """``d``'s values of the fields of the dataclass ``cls``, to build it with.

    ``derived``: keys that ``to_dict`` writes beside the fields (a property's value), skipped;
    ``exclude``: fields not read from ``d`` by name, which the caller builds (a model kept in memory
    only, the columns of a curve written as its points). Any other
    key that is not a field, or a field without a default that ``d`` lacks, is one
    :class:`ConfigError` naming them and the fields ``cls`` has.
    """
    fields = [f for f in dataclasses.fields(cls) if f.init and f.name not in set(exclude)]
    names = {f.name for f in fields}
    unknown = sorted(set(d) - names - set(derived))
    missing = [f.name for f in fields if f.name not in d and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if unknown or missing:
        problems = ([f"it has no field {', '.join(missing)}"] if missing else []) + (
            [f"{', '.join(unknown)} {'is not a field' if len(unknown) == 1 else 'are not fields'}"] if unknown else [])
        raise ConfigError(f"{what} of schema_version {d.get('schema_version', 1)} does not read as "
                          f"{cls.__name__}: {'; '.join(problems)} (its fields: {', '.join(sorted(names))}).")
    return {k: v for k, v in d.items() if k in names}
