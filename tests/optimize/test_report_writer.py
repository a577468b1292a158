"""optimize writes report.html through the writer proftune.report registers, and none without one."""

from __future__ import annotations

from pathlib import Path

import pytest

import proftune._report_writers as writers
from proftune._registry import Registry
from proftune.optimize._output import write_html


def test_the_report_registers_its_writer() -> None:
    from proftune.report import write_report

    assert writers.report_writer("html") is write_report
    assert writers.report_writer("pdf") is None


def test_no_report_without_a_registered_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writers, "REPORT_WRITERS", Registry("report writer"))
    assert write_html(1, tmp_path, store=None) is None  # the store is never read
    assert list(tmp_path.iterdir()) == []
