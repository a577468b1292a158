"""A command's Run is ``finished`` only once every output it writes is written (issue 47).

A library function finishes its Run when its work is done; the command that called it then
writes ``--out``, ``--report`` and the like. Inside :func:`held_until_written` a top-level Run
that is finished in this thread is recorded with its result but kept ``running`` until the block
ends: finished then, or, when a write fails (a full disk: the :class:`OutputWriteError` of
``_paths.replacing``, which names the file and its device's free space), ``failed`` with that
error and the outputs that were kept (``interrupted`` on Ctrl-C or SIGTERM). Inside the block the
held Run reads as it will be recorded (``finished``, with the end time and duration of its work),
so the report written there shows that, and the Run is recorded with that same end time.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["HeldRuns", "held_until_written", "kept_files", "not_held"]


@dataclass
class HeldRuns:
    """The Runs held ``running`` until the outputs are written: ``(store, run id)`` in the order held."""

    runs: list[tuple[Any, int]] = field(default_factory=list)
    #: When each held Run's work ended (ISO time), by ``(store url, run id)``.
    ended: dict[tuple[str, int], str] = field(default_factory=dict)

    def holds(self, url: str, run_id: int) -> bool:
        return any(store.url == url and rid == run_id for store, rid in self.runs)


_HELD: contextvars.ContextVar[HeldRuns | None] = contextvars.ContextVar("proftune_held_runs", default=None)


def held() -> HeldRuns | None:
    """The Runs held in this thread's context (None: outside :func:`held_until_written`)."""
    return _HELD.get()


def kept_files(outputs: Iterable[str | Path | None]) -> list[str]:
    """The outputs that exist (a folder's files, hidden temporary files left out), as paths."""
    kept: list[str] = []
    for out in outputs:
        if out is None or str(out) == "":
            continue
        path = Path(out)
        if path.is_dir():
            kept += sorted(str(p) for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            kept.append(str(path))
    return kept


@contextlib.contextmanager
def held_until_written(outputs: Iterable[str | Path | None] = ()) -> Iterator[HeldRuns]:
    """Hold every top-level Run finished inside the block ``running`` until the block ends
    (``outputs``: the files and folders the block writes, for the list of what was kept)."""
    paths = list(outputs)
    runs = HeldRuns()
    token = _HELD.set(runs)
    try:
        yield runs
    except BaseException as exc:
        _HELD.reset(token)
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        kept = kept_files(paths)
        error = f"{type(exc).__name__}: {exc}; kept: {', '.join(kept) if kept else 'no output'}"
        for store, run_id in runs.runs:
            with contextlib.suppress(Exception):  # the write's error is the one the user must see
                record = store.get_run(run_id)
                if record.status == "running":
                    store.finish_run(run_id, status=status, error=error, artifacts={**record.artifacts, "kept": kept})
        raise
    _HELD.reset(token)
    for store, run_id in runs.runs:
        if store.get_run(run_id).status == "running":  # a command may have failed it (tune: every trial failed)
            store.finish_run(run_id, status="finished", ended_at=runs.ended.get((store.url, run_id)))


@contextlib.contextmanager
def not_held() -> Iterator[None]:
    """Runs finished inside the block are finished at once, inside :func:`held_until_written`
    too: the runs of one stage of a longer command (optimize's diagnose, profile, tune, ...) end
    with the stage, with its own status and end time, not with the command's outputs."""
    token = _HELD.set(None)
    try:
        yield
    finally:
        _HELD.reset(token)
