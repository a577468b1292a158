"""Where the user's code failed: the task's method and its file:line, so that a failure's one-line
message (no ``--debug``) points at the line to fix. Frames of proftune, of the standard library
and of installed packages (torch, optuna, ...) are not the user's."""

from __future__ import annotations

import linecache
import os
import re
import sysconfig
import traceback
from pathlib import Path
from types import FrameType

__all__ = ["failed_in"]

_OWN = str(Path(__file__).resolve().parent) + os.sep
_LIBRARIES = tuple(sorted({str(Path(p).resolve()) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
                           if (p := sysconfig.get_paths().get(key))}))
#: The task methods that hand proftune data: a failure inside the DataLoader they return (a ragged
#: batch that default_collate cannot stack) has no frame of the user's, only of the loop reading it.
_DATA_METHODS = ("train_data", "val_data", "test_data", "example_batch")


def _is_users(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    resolved = os.path.realpath(filename)
    return not resolved.startswith((_OWN, *_LIBRARIES))


def _shown(filename: str, line: int) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive
        rel = filename
    return f"{filename if rel.startswith('..') else rel}:{line}"


def _name(frame: FrameType) -> str:
    qualname = getattr(frame.f_code, "co_qualname", None)  # Python 3.11+
    if qualname is None and "self" in frame.f_locals:
        return f"{type(frame.f_locals['self']).__qualname__}.{frame.f_code.co_name}"
    return str(qualname or frame.f_code.co_name)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from or during, the original last."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen and len(seen) < 16:
        seen.append(exc)
        nxt = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None:
            break
        exc = nxt
    return seen


def _data_method(frames: list[tuple[FrameType, int]]) -> str | None:
    """A failure while reading a task's data: ``Class.train_data (file:line)`` from the innermost
    of proftune's frames that calls one of the task's data methods, with the task in its locals."""
    from .task import Task

    for frame, line in reversed(frames):
        if not os.path.realpath(frame.f_code.co_filename).startswith(_OWN):
            continue
        source = linecache.getline(frame.f_code.co_filename, line)
        called = re.search(r"\.(" + "|".join(_DATA_METHODS) + r")\(", source)
        if called is None:
            continue
        for value in list(frame.f_locals.values()):
            task = value if isinstance(value, Task) else getattr(value, "task", None)
            while isinstance(task, Task) and hasattr(task, "inner") and isinstance(task.inner, Task):
                task = task.inner  # a wrapper (held-out split, full batches) of the user's task
            if isinstance(task, Task):
                method = getattr(type(task), called.group(1), None)
                code = getattr(method, "__code__", None)
                if code is not None and _is_users(code.co_filename):
                    return (f"in the data of {type(task).__qualname__}.{called.group(1)} "
                            f"({_shown(code.co_filename, code.co_firstlineno)})")
    return None


def failed_in(exc: BaseException) -> str | None:
    """``'in Task.evaluate (task.py:23)'``: the innermost frame of the user's code that ``exc``
    (or what it was raised from) went through, and the task method it was called from when that
    is another one; for data a task's method returned, that method. None: no user code took part."""
    for err in reversed(_chain(exc)):
        frames = list(traceback.walk_tb(err.__traceback__))
        users = [(f, line) for f, line in frames if _is_users(f.f_code.co_filename)]
        if users:
            inner, line = users[-1]
            text = f"in {_name(inner)} ({_shown(inner.f_code.co_filename, line)})"
            outer, outer_line = users[0]
            if outer is not inner and _name(outer) != _name(inner):
                text += f", called from {_name(outer)} ({_shown(outer.f_code.co_filename, outer_line)})"
            return text
        data = _data_method(frames)
        if data is not None:
            return data
    return None
