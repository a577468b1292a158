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

A record nested in another (a finding in a diagnosis, a trial in a search, an arm of the race)
has no version of its own: the record that holds it covers it. It is a :class:`JsonRecord`, read
through the same :func:`record_fields`, the fields that hold records through ``READERS``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar, cast

from .exceptions import ConfigError

__all__ = ["JsonRecord", "Reader", "each", "mapping", "optional", "plain", "record_fields", "stored_version"]

R = TypeVar("R", bound="JsonRecord")
#: Reads one field's JSON back (a nested record's ``from_dict``).
Reader = Callable[[Any], Any]


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


def mapping(d: Any, *, what: str) -> Mapping[str, Any]:
    """``d`` when it is a JSON object; else a :class:`ConfigError` naming ``what`` it should be
    (a nested record's check; a versioned one's is :func:`stored_version`)."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{what} must be a JSON object, but got {type(d).__name__}.")
    return d


def plain(value: Any) -> Any:
    """``value`` with every record in it (anything with ``to_dict``) as its dict, tuples as lists."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    to_dict = getattr(value, "to_dict", None)
    return to_dict() if callable(to_dict) else value


def each(read: Reader) -> Reader:
    """A reader of a list of what ``read`` reads."""
    return lambda xs: [read(x) for x in xs or []]


def optional(read: Reader) -> Reader:
    """``read``, or None for an empty value (``{}``: nothing was measured)."""
    return lambda x: read(x) if x else None


class JsonRecord:
    """A frozen dataclass nested in a versioned record: ``to_dict`` is its fields (records in them
    as their dicts), ``from_dict`` reads them back through :func:`record_fields`, each field that
    holds records through its reader in ``READERS``. ``WHAT`` names it in messages. A record stored
    on its own sets ``SCHEMA``, the version this proftune writes: ``from_dict`` reads its
    ``schema_version`` through :func:`stored_version` first. ``DERIVED`` names attributes (properties)
    that ``to_dict`` writes after the fields, and ``from_dict`` skips; ``OMIT_NONE`` fields that
    ``to_dict`` leaves out where None (the JSON as it was before them)."""

    WHAT: ClassVar[str] = "a record"
    READERS: ClassVar[dict[str, Reader]] = {}
    SCHEMA: ClassVar[int | None] = None
    DERIVED: ClassVar[tuple[str, ...]] = ()
    OMIT_NONE: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(cast(Any, self))}
        return {k: plain(v) for k, v in values.items() if v is not None or k not in self.OMIT_NONE} | {
            k: plain(getattr(self, k)) for k in self.DERIVED}

    @classmethod
    def from_dict(cls: type[R], d: Any) -> R:
        if cls.SCHEMA is not None:
            stored_version(d, what=cls.WHAT, current=cls.SCHEMA)
        kw = record_fields(cls, mapping(d, what=cls.WHAT), what=cls.WHAT, derived=cls.DERIVED)
        return cls(**{k: cls.READERS[k](v) if k in cls.READERS and v is not None else v for k, v in kw.items()})
