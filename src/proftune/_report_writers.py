"""The HTML report of a run, for the units below ``proftune.report`` that write one.

``proftune.report`` registers its writer here when it is imported, as its pages register with
``register_renderer``; a unit below it (``optimize``, which leaves ``report.html`` beside its other
outputs) asks :func:`report_writer` and writes no report where none is registered (no report
feature installed). So the lower unit names no higher one, not even through ``importlib``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from ._registry import Registry

__all__ = ["REPORT_WRITERS", "ReportWriter", "report_writer"]


class ReportWriter(Protocol):
    """Writes the report of ``source`` (a run id or a run record) to ``out``; the path written."""

    def __call__(self, source: Any = None, out: str | Path | None = None, *, store: Any = None) -> Path: ...


#: The report writers by format (``html``: ``proftune.report.write_report``).
REPORT_WRITERS: Registry[ReportWriter] = Registry("report writer")


def report_writer(fmt: str = "html") -> ReportWriter | None:
    """The registered writer of ``fmt`` reports, or None where no report feature registered one."""
    return REPORT_WRITERS.get(fmt)
