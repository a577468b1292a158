"""Lines torch's C++ code logs to stderr while proftune drives it, kept off the user's terminal.

``torch.profiler`` with ``profile_memory=True`` on CPU (the CPU peak of a step, a trace) logs
``CPUAllocator.cpp:245] Memory block of unknown size was allocated before the profiling
started, profiler results will not include the deallocation event`` whenever a tensor made
before the window is freed inside it (one line per 1,000 such frees). It is written by c10's
logging straight to file descriptor 2; nothing at run time turns it off (``TORCH_CPP_LOG_LEVEL``,
which ``import proftune`` sets, is read once, when torch loads: a script that imports torch
first still gets the line), and the peak does not need those frees (the window opens with the
bytes already live counted). So while such a window is open, :func:`filtered_cpp_logs`
points fd 2 at a temporary file; when it closes, what was written goes back to the real stderr,
in order, except the known lines, which go to the ``proftune.cpp`` logger at DEBUG level (a
configured logger shows them; so does the CLI's ``--debug``, through :func:`cpp_logs_shown`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator

__all__ = ["KNOWN_CPP_LINES", "cpp_logs_shown", "filtered_cpp_logs"]

_log = logging.getLogger("proftune.cpp")

#: C++ log lines that say nothing a proftune user can act on.
KNOWN_CPP_LINES = (re.compile(rb"CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated before"),)

_lock = threading.Lock()
_depth = 0  # windows open now; only the outermost one moves fd 2
_shown = False


@contextlib.contextmanager
def cpp_logs_shown() -> Iterator[None]:
    """Leave stderr alone inside: every C++ line reaches the terminal (the CLI's ``--debug``)."""
    global _shown
    before, _shown = _shown, True
    try:
        yield
    finally:
        _shown = before


def _flush_python_stderr() -> None:
    with contextlib.suppress(Exception):  # a replaced or closed sys.stderr: nothing to flush
        sys.stderr.flush()


@contextlib.contextmanager
def filtered_cpp_logs() -> Iterator[None]:
    """Hold what is written to fd 2 inside the block and write it back after it, less
    :data:`KNOWN_CPP_LINES` (logged at DEBUG instead). Re-entrant; a no-op when stderr has no
    file descriptor or :func:`cpp_logs_shown` is active."""
    global _depth
    with _lock:
        outer = _depth == 0
        _depth += 1
    saved = capture = None
    try:
        if outer and not _shown:
            try:
                _flush_python_stderr()
                saved = os.dup(2)
                capture = tempfile.TemporaryFile()
                os.dup2(capture.fileno(), 2)
            except OSError:  # no fd 2 to move (a detached process): nothing reaches a terminal anyway
                if saved is not None:
                    os.close(saved)
                saved = None
        yield
    finally:
        with _lock:
            _depth -= 1
        if saved is not None and capture is not None:
            _flush_python_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            with capture:
                capture.seek(0)
                _replay(capture.read())


def _replay(data: bytes) -> None:
    """Write ``data`` to fd 2 but for the known lines, which are logged."""
    keep: list[bytes] = []
    for line in data.splitlines(keepends=True):
        if any(p.search(line) for p in KNOWN_CPP_LINES):
            _log.debug("torch: %s", line.decode(errors="replace").rstrip())
        else:
            keep.append(line)
    out = memoryview(b"".join(keep))
    while out:
        out = out[os.write(2, out):]
