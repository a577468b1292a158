"""How the loop writes a number for people (three significant digits, milliseconds) and a
compression method by its name: the story's sentences and the stages' notes alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._jsonsafe import finite_float as _f

if TYPE_CHECKING:
    from ._records import ModelFigures

__all__ = ["fmt", "method_name", "rounded"]


def fmt(v: Any, digits: int = 3) -> str:
    """A number for people: three significant digits (``0.0679``, ``0.887``), ints as they are;
    a mapping or a list figure by figure (``optimizer sgd, lr 0.0869``: never a float's repr)."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, Mapping):
        return ", ".join(f"{k} ({fmt(x, digits)})" if isinstance(x, Mapping) else f"{k} {fmt(x, digits)}"
                         for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(x, digits) for x in v) + "]"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    f = _f(v)
    if f is None:
        return str(v)
    if f.is_integer() and abs(f) < 1e6:
        return str(int(f))
    return f"{f:.{digits}g}"


#: A decimal number in a sentence, with its exponent: at the end of a sentence ("0.0869.") and
#: before a unit ("0.0869s", "1.99x") too; not a version's part ("2.14.1").
_DECIMAL = re.compile(r"(?<![\w.])([+-]?)(\d+\.\d+)([eE][+-]?\d+)?(?!\d|\.\d)")


def rounded(text: Any) -> str:
    """``text`` with every decimal number in it cut to three significant digits (sentences from
    other parts: "the mean gain -0.002778 is not a gain" -> "-0.00278")."""
    def cut(m: re.Match[str]) -> str:
        digits = m.group(2).replace(".", "").lstrip("0")
        if len(digits) <= 3:
            return m.group(0)
        return f"{m.group(1)}{float(m.group(2) + (m.group(3) or '')):.3g}"

    return _DECIMAL.sub(cut, str(text))


def method_name(c: ModelFigures) -> str:
    """A compression candidate as people name it: ``structured pruning 50% + dynamic INT8``."""
    words = {"dynamic": "dynamic INT8", "static": "static INT8", "qat": "INT8 (QAT)",
             "structured": "structured pruning", "unstructured": "unstructured pruning"}
    ratio = _f(c.ratio)
    out = []
    for part in str(c.method or "-").split("+"):
        name = words.get(part, part)
        if "pruning" in name and ratio:
            name += f" {ratio:.0%}"
        out.append(name)
    return " + ".join(out)
