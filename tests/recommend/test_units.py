from __future__ import annotations

import pytest

from proftune import ConfigError
from proftune.recommend import format_bytes, parse_memory


@pytest.mark.parametrize(("text", "expected"), [
    ("4GiB", 4 * 1024**3), ("512MB", 512 * 1000**2), ("123456", 123456), ("1.5 KiB", 1536),
    ("2g", 2 * 1000**3), ("10mib", 10 * 1024**2), (4096, 4096), ("1e6", 10**6),
])
def test_parse_memory_accepts_si_and_binary_units(text: str | int, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "4 parsecs", "GiB", "-5MB", "0", "1..2GB", True])
def test_parse_memory_rejects_nonsense_naming_the_parameter(text: object) -> None:
    with pytest.raises(ConfigError, match="memory_budget"):
        parse_memory(text)  # type: ignore[arg-type]


def test_format_bytes_uses_binary_units() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**3) == "3 GiB"
    assert format_bytes(None) == "-"
