"""Turn results into JSON: one place, one policy for values JSON cannot hold.

Policy: a non-finite float (NaN, +/-Inf) becomes ``null``, as JavaScript's ``JSON.stringify``
writes it (RFC 8259 JSON has no NaN); where a non-finite value is news (a diverged loss) the
record says so in its anomalies, with the value as text. Tuples become lists, keys strings,
objects with ``to_dict()`` their dict, tensors and NumPy scalars their Python value, anything
else its ``str``.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["json_safe"]


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
