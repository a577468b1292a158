"""Memory sizes as people write them (``4GiB``, ``512MB``, ``123456``) and back."""

from __future__ import annotations

import math
import re

from .exceptions import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_memory(value: str | int | float, *, name: str = "memory_budget") -> int:
    """Bytes in ``value``: an int, or a string such as ``4GiB``, ``512MB``, ``1.5G``, ``123456``.

    SI units (kB, MB, GB, TB) are powers of 1000, binary units (KiB, MiB, GiB, TiB) of 1024.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a memory size; give e.g. 4GiB, 512MB or 123456.")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _PATTERN.match(str(value))
        if match is None or match.group(2).lower() not in _UNITS:
            raise ConfigError(
                f"{name}={value!r} is not a memory size; give a number of bytes with an optional "
                f"unit, e.g. 4GiB, 512MB, 123456 (units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)."
            )
        number, unit = float(match.group(1)), match.group(2).lower()
    size = number * _UNITS[unit]
    if not math.isfinite(size) or size < 1:
        raise ConfigError(f"{name}={value!r} must be at least 1 byte.")
    return int(size)


def format_bytes(n: float | None) -> str:
    """``1536`` -> ``'1.5 KiB'``; binary units, three significant digits."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1024
    return f"{size:.3g} TiB"  # pragma: no cover


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_DURATION_UNITS = {
    "": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "ms": 1e-3, "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
}


def parse_duration(value: str | int | float, *, name: str = "budget") -> float:
    """Seconds in ``value``: a number of seconds, or ``90s``, ``250ms``, ``5m``, ``5min``, ``1h``.

    Raises :class:`ConfigError` for anything else and for a duration that is not > 0.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a duration; give e.g. 90, 90s, 5m, 5min or 1h.")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None or match.group(2).lower() not in _DURATION_UNITS:
            raise ConfigError(f"{name}={value!r} is not a duration; give a number of seconds with an "
                              "optional unit, e.g. 90, 90s, 250ms, 5m, 5min, 1h.")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{name}={value!r} must be a duration > 0 seconds.")
    return seconds
