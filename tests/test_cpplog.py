"""The C++ log filter: known torch lines leave stderr (to a DEBUG logger), everything else stays."""

from __future__ import annotations

import logging
import os

import pytest

from proftune._cpplog import cpp_logs_shown, filtered_cpp_logs

KNOWN = (b"[W1201 08:44:33.269247867 CPUAllocator.cpp:245] Memory block of unknown size was allocated "
         b"before the profiling started, profiler results will not include the deallocation event\n")


def test_known_lines_are_logged_and_the_rest_is_written_back_in_order(
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="proftune.cpp")
    with filtered_cpp_logs():
        os.write(2, b"first\n")
        os.write(2, KNOWN)
        with filtered_cpp_logs():  # nested: the outer window holds it all
            os.write(2, b"second\n")
        os.write(2, KNOWN)
    err = capfd.readouterr().err
    assert err == "first\nsecond\n"
    logged = [r.getMessage() for r in caplog.records if r.name == "proftune.cpp"]
    assert len(logged) == 2
    assert all("Memory block of unknown size" in m for m in logged)


def test_cpp_logs_shown_leaves_stderr_alone(capfd: pytest.CaptureFixture[str]) -> None:
    with cpp_logs_shown(), filtered_cpp_logs():
        os.write(2, KNOWN)
    assert "Memory block of unknown size" in capfd.readouterr().err
