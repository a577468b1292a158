"""Turn results into JSON: one place, one policy for values JSON cannot hold.

Every JSON proftune writes (a file, ``--json``, a Store column, a hash's canonical text) goes
through :func:`json_dumps`, so no writer emits ``NaN`` (which strict parsers reject) or falls
back to ``default=str`` on its own.

Policy: a non-finite float (NaN, +/-Inf) becomes ``null``, as JavaScript's ``JSON.stringify``
writes it (RFC 8259 JSON has no NaN); where a non-finite value is news (a diverged loss) the
record says so in its anomalies, with the value as text. Tuples become lists, keys strings,
objects with ``to_dict()`` their dict, tensors and NumPy scalars their Python value, anything
else its ``str``.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["finite_float", "is_finite_number", "json_dumps", "json_safe"]


def json_safe(value: Any) -> Any:
    """A copy of ``value`` that ``json.dumps(..., allow_nan=False)`` accepts (see the module doc)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return json_safe(to_dict())
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return json_safe(item())
        except (TypeError, ValueError, RuntimeError):  # a tensor of many elements: keep its text
            return str(value)
    return str(value)


def json_dumps(value: Any, *, indent: int | None = None, sort_keys: bool = False,
               separators: tuple[str, str] | None = None) -> str:
    """``value`` as strict JSON text (RFC 8259: no NaN or Infinity), cleaned by :func:`json_safe`."""
    return json.dumps(json_safe(value), indent=indent, sort_keys=sort_keys, separators=separators,
                      allow_nan=False)


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None: for NaN, +/-Inf, None, a bool (a flag, not a
    measurement), a string, or anything ``float()`` refuses (a tensor of many elements)."""
    if value is None or isinstance(value, (bool, str, bytes)):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return f if math.isfinite(f) else None


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` is a number that a chart, a logger or a mean can take (see :func:`finite_float`)."""
    return finite_float(value) is not None
