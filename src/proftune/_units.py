"""Quantities as people write them: memory (``4GiB``, ``512MB``), durations (``90s``, ``5min``),
a metric's limit in its own unit (``step_time_ms<1s`` is 1000 ms); and back (``format_bytes``,
``format_ms``, ``format_seconds``)."""

from __future__ import annotations

import math
import re

from ._jsonsafe import finite_float
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
    for unit in ("B", "KiB", "MiB"):
        if abs(size) < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1024
    return f"{size:.3g} GiB"


def format_ms(v: object) -> str:
    """Milliseconds, three significant digits: ``0.0164 ms``, ``1.12 ms``, ``240 ms``; ``-`` for no number."""
    f = finite_float(v)
    return "-" if f is None else f"{f:.3g} ms"


def format_seconds(v: object) -> str:
    """Seconds: ``12.3 s``, whole from 100 (``240 s``); ``-`` for no number."""
    f = finite_float(v)
    return "-" if f is None else (f"{f:.0f} s" if f >= 100 else f"{f:.1f} s")


# -- durations ----------------------------------------------------------------------------------
#: Seconds per time unit as people write them.
_SECONDS = {
    "": 1.0, "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "ms": 1e-3, "us": 1e-6, "µs": 1e-6,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
}
_TIME_UNITS = "ms, s, min (or m), h"
#: The longest duration any option takes (a budget, a timeout): 30 days.
MAX_DURATION_S = 30 * 86400.0
_MEMORY_UNITS = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB"
_QUANTITY = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-zµ]*)\s*$", re.IGNORECASE)


def parse_duration(value: str | int | float, *, name: str = "timeout") -> float:
    """Seconds in ``value``: a number (seconds) or ``90s``, ``5m``, ``5min``, ``1h``, ``250ms``."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a duration; give e.g. 90, 90s, 5min, 1h or 250ms.")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _QUANTITY.match(str(value))
        unit = match.group(2).lower() if match else ""
        if match is None or unit not in _SECONDS:
            raise ConfigError(f"{name}={value!r} is not a duration; give a number of seconds with an "
                              f"optional unit, e.g. 90, 90s, 5min, 1h, 250ms (units: {_TIME_UNITS}).")
        seconds = float(match.group(1)) * _SECONDS[unit]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{name}={value!r} must be a finite duration > 0 seconds.")
    if seconds > MAX_DURATION_S:
        raise ConfigError(f"{name}={value!r} is longer than the longest duration proftune takes, "
                          f"30 days ({MAX_DURATION_S:.0f} s); give e.g. 90s, 5min, 2h or 720h.")
    return seconds


#: Plain scale factors for counts (``params<2M``).
_COUNT = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "b": 1e9, "t": 1e12}
#: Seconds per unit of a time metric's own unit.
_TIME_METRIC_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6, "min": 60.0}


def parse_quantity(value: str | int | float, *, unit: str, name: str) -> float:
    """``value`` in the metric's own ``unit`` (the registry's: ``ms``, ``bytes``, ``count``, ...).

    A bare number is already in ``unit``. Time metrics take ``ms``, ``s``, ``min``, ``h``
    (``1s`` for a metric in ms is 1000); byte metrics take ``KiB``, ``MB``, ``GiB``, ...;
    counts take ``k``, ``M``, ``G``. A unit of the wrong kind (``2GiB`` for a time) is a
    :class:`ConfigError` that names the valid units.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a number.")
    if isinstance(value, (int, float)):
        return float(value)
    match = _QUANTITY.match(str(value))
    if match is None:
        raise ConfigError(f"{name}={value!r} is not a number with an optional unit.")
    number, suffix = float(match.group(1)), match.group(2)
    low = suffix.lower()
    if not suffix:
        return number
    if unit in _TIME_METRIC_UNITS:
        if low not in _SECONDS:
            raise ConfigError(f"{name}={value!r}: {suffix!r} is not a unit of time; valid: {_TIME_UNITS}.")
        return number * _SECONDS[low] / _TIME_METRIC_UNITS[unit]
    if unit == "bytes":
        if low not in _UNITS:
            raise ConfigError(f"{name}={value!r}: {suffix!r} is not a unit of memory; valid: {_MEMORY_UNITS}.")
        return number * _UNITS[low]
    if low in _COUNT:
        return number * _COUNT[low]
    raise ConfigError(f"{name}={value!r}: {suffix!r} is not a scale for a value in {unit or 'plain numbers'}; "
                      "valid: k, M, G (or none).")
