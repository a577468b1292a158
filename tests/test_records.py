"""The one policy for reading a result record back: versions and keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from proftune._records import JsonRecord, record_fields, stored_version
from proftune.exceptions import ConfigError


@dataclass(frozen=True)
class _Rec:
    size: int
    name: str = ""
    rows: list[int] = field(default_factory=list)
    model: Any = None
    schema_version: int = 2


def test_a_record_without_a_version_reads_as_version_1() -> None:
    assert stored_version({"size": 1}, what="a thing", current=2) == 1
    assert stored_version({"size": 1, "schema_version": 2}, what="a thing", current=2) == 2


@pytest.mark.parametrize("bad", [0, -1, "1", 1.0, True, None])
def test_a_version_is_a_positive_integer(bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"a thing has schema_version=.*an integer >= 1"):
        stored_version({"schema_version": bad}, what="a thing", current=2)


def test_a_newer_version_names_both() -> None:
    with pytest.raises(ConfigError,
                       match=r"schema_version=3, newer than this proftune reads \(schema_version 1 to 2\)"):
        stored_version({"schema_version": 3}, what="a thing", current=2)
    with pytest.raises(ConfigError, match="must be a JSON object, but got list"):
        stored_version([1], what="a thing", current=2)


def test_fields_read_by_name_defaults_fill_what_an_older_record_lacks() -> None:
    assert record_fields(_Rec, {"size": 3, "schema_version": 2}, what="a thing") == {"size": 3, "schema_version": 2}
    assert _Rec(**record_fields(_Rec, {"size": 3}, what="a thing")) == _Rec(3)


def test_a_renamed_or_missing_field_is_one_error_naming_it() -> None:
    with pytest.raises(ConfigError) as info:
        record_fields(_Rec, {"n": 3, "title": "x"}, what="a thing")
    text = str(info.value)
    assert "it has no field size" in text
    assert "n, title are not fields" in text
    assert "its fields: model, name, rows, schema_version, size" in text


def test_derived_keys_are_skipped_and_excluded_fields_are_not_read() -> None:
    assert record_fields(_Rec, {"size": 1, "total": 9}, what="a thing", derived=("total",)) == {"size": 1}
    with pytest.raises(ConfigError, match="model is not a field"):
        record_fields(_Rec, {"size": 1, "model": "weights"}, what="a thing", exclude=("model",))


@dataclass(frozen=True)
class _Stored(JsonRecord):
    WHAT: ClassVar[str] = "a stored thing"
    SCHEMA: ClassVar[int | None] = 2

    size: int
    rows: tuple[int, ...] = ()
    schema_version: int = 2


def test_a_json_record_with_a_schema_reads_its_version_through_the_one_policy() -> None:
    rec = _Stored(size=3, rows=(1, 2))
    assert rec.to_dict() == {"size": 3, "rows": [1, 2], "schema_version": 2}
    assert _Stored.from_dict(rec.to_dict()) == _Stored(size=3, rows=[1, 2])  # type: ignore[arg-type]
    assert _Stored.from_dict({"size": 3}).schema_version == 2  # a record before versions: the field's default
    with pytest.raises(ConfigError, match=r"a stored thing has schema_version=3, newer than this proftune reads"):
        _Stored.from_dict({"size": 3, "schema_version": 3})
    with pytest.raises(ConfigError, match=r"a stored thing must be a JSON object"):
        _Stored.from_dict([3])
