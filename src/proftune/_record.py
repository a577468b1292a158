"""Reading a versioned record back from its JSON: one check of its ``schema_version`` and keys.

A result kind is a frozen dataclass with ``schema_version``, ``to_dict`` and ``from_dict``
(ARCHITECTURE.md). Its ``from_dict`` calls :func:`record_fields`: a dict without
``schema_version`` was written before the record had one and reads as version 1; a newer
version, a key the record does not define (a field its producer renamed) or a missing required
field is one ConfigError naming them, so a producer's change fails where the record is read
instead of rendering as a blank cell. A record nested in another (a finding in a diagnosis, a
trial in a search) has no version of its own: the one of the record that holds it covers it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeVar, cast

from .exceptions import ConfigError

__all__ = ["JsonRecord", "Reader", "each", "optional", "plain", "record_fields"]

R = TypeVar("R", bound="JsonRecord")
#: Reads one field's JSON back (a nested record's ``from_dict``).
Reader = Callable[[Any], Any]


def record_fields(cls: type, d: Any, *, kind: str, version: int | None = None,
                  derived: Iterable[str] = (), built: Iterable[str] = ()) -> dict[str, Any]:
    """The keyword arguments of the dataclass ``cls`` from its dict ``d`` (``to_dict()``'s JSON).

    ``kind`` names the record in messages; ``version`` is the ``schema_version`` this proftune
    writes (None for a nested record); ``derived`` are keys ``to_dict`` writes for readers that
    are not fields (a count, a flag, a line of text): accepted and left out; ``built`` are fields
    the caller builds itself from such keys (not required here). A record of an older
    version is read as it is (version 1 is the only one yet); ``schema_version`` is set to
    ``version``.
    """
    if not isinstance(d, Mapping):
        raise ConfigError(f"{_a(kind)} record must be a JSON object, but got {type(d).__name__}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    filled, problems = set(built), list[str]()
    read = 1
    if version is not None:
        read = d.get("schema_version", 1)  # absent: written before the record had one
        if isinstance(read, bool) or not isinstance(read, int) or read < 1:
            raise ConfigError(f"the {kind} record's schema_version={read!r} is not a version (an integer >= 1).")
        if read > version:
            raise ConfigError(f"the {kind} record has schema_version={read}, newer than the version this "
                              f"proftune reads ({version}); upgrade proftune to read it.")
    skip = set(derived) | {"schema_version"}
    unknown = sorted(k for k in d if k not in fields and k not in skip)
    if unknown:
        problems.append(f"the {kind} record has field(s) {', '.join(map(repr, unknown))} that schema_version "
                        f"{read} does not define; its fields: {', '.join(n for n in fields if n != 'schema_version')}.")
    missing = [n for n, f in fields.items() if n not in d and n != "schema_version" and n not in filled
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        problems.append(f"the {kind} record lacks the required field(s) {', '.join(map(repr, missing))} of "
                        f"schema_version {read}.")
    if problems:
        raise ConfigError(problems, header=f"this JSON is not {_a(kind)} record of schema_version {read}:")
    kw = {k: v for k, v in d.items() if k in fields and k != "schema_version"}
    if version is not None and "schema_version" in fields:
        kw["schema_version"] = version
    return kw


def _a(kind: str) -> str:
    return ("an " if kind[:1] in "aeiou" else "a ") + kind


def plain(value: Any) -> Any:
    """``value`` with every record in it (anything with ``to_dict``) as its dict, lists kept."""
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
    as their dicts), ``from_dict`` reads them back through :func:`record_fields`, and each field
    that holds records through its reader in ``READERS``. ``KIND`` names it in messages."""

    KIND: ClassVar[str] = "record"
    READERS: ClassVar[dict[str, Reader]] = {}

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(cast(Any, self))}

    @classmethod
    def from_dict(cls: type[R], d: Any) -> R:
        kw = record_fields(cls, d, kind=cls.KIND)
        return cls(**{k: cls.READERS[k](v) if k in cls.READERS and v is not None else v for k, v in kw.items()})
