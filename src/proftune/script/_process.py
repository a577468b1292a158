"""One run of a script in its own process: its metrics read as it runs (``proftune.report`` calls,
a Lightning or Hugging Face Trainer's metrics, TensorBoard scalars it writes, then ``name=value`` /
``name: value`` lines on stdout), ended cleanly when pruned or interrupted."""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ._channel import REPORT_ENV, ChannelLine
from ._flags import child_env

__all__ = ["GRACE_S", "ScriptRun", "metric_lines", "run_process"]

#: Seconds a script has to end after SIGTERM before it is killed.
GRACE_S = 5.0
#: The same at a budget's hard end, where every second past it is the user's.
CUT_GRACE_S = 1.0
#: Lines of a script's output kept with its Run.
TAIL_LINES = 40
#: ``name=value`` or ``name: value``, several on one line (``epoch 3 val_acc=0.91 loss: 0.2``).
_METRIC = re.compile(r"(?<![\w.\-/])([A-Za-z_][\w\-]*(?:/[A-Za-z_][\w\-]*)*)\s*(?:=|:)\s*"
                     r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf)(?![\w.])", re.IGNORECASE)
#: What the name of a metric printed on stdout looks like (beyond the one watched).
_METRIC_NAME = re.compile(r"acc|loss|err|test|val|eval|f1|auc|score|ppl|perplexity|bleu|rouge|mse|mae|rmse|iou|map",
                          re.IGNORECASE)
#: Names on a metric's line that give its step.
_STEP_KEYS = ("epoch", "step", "iter", "iteration")
#: Where a metric came from, in the order one is preferred.
SOURCES = ("proftune.report", "lightning", "transformers", "tensorboard", "stdout")


def metric_lines(line: str) -> dict[str, float]:
    """The ``name=value`` / ``name: value`` pairs of one output line."""
    return {m.group(1): float(m.group(2)) for m in _METRIC.finditer(line)}


@dataclass
class ScriptRun:
    """How one process of the script ended and what it reported."""

    command: list[str]
    exit_code: int | None = None
    #: The last value of each metric, from its preferred source.
    metrics: dict[str, float] = field(default_factory=dict)
    #: metric -> the source it was read from (one of SOURCES).
    sources: dict[str, str] = field(default_factory=dict)
    #: Each report of the watched metric: (step, value).
    history: list[tuple[int, float]] = field(default_factory=list)
    profile: dict[str, float] = field(default_factory=dict)
    tail: list[str] = field(default_factory=list)
    pruned: bool = False
    interrupted: str | None = None
    #: Ended at the ``deadline`` it was given (a budget's end), not by its own time limit.
    cut: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.pruned


class _Reads:
    """The metrics seen so far, by source; ``watch``'s new values in order."""

    def __init__(self, watch: str | None) -> None:
        self.watch = watch
        self.by_source: dict[str, dict[str, float]] = {s: {} for s in SOURCES}
        self.counts: dict[str, int] = collections.Counter()
        self.new: list[tuple[str, int, float]] = []  # (source, step, value) of ``watch``, in order
        self.handed = 0  # how many of ``new`` went to should_stop
        self.profile: dict[str, float] = {}

    def add(self, source: str, values: dict[str, float], step: int | None) -> None:
        self.by_source[source].update(values)
        if self.watch in values:
            self.counts[source] += 1
            self.new.append((source, self.counts[source] if step is None else int(step), values[self.watch]))


def _pump(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


def _end(proc: subprocess.Popen[str], grace_s: float) -> None:
    """SIGTERM to the script's process group (its own workers too), SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_process(argv: Sequence[str], *, watch: str | None, profile: bool = False,
                should_stop: Callable[[int, float], bool] | None = None, grace_s: float = GRACE_S,
                echo: IO[str] | None = None, timeout_s: float | None = None,
                deadline: float | None = None) -> ScriptRun:
    """Run ``python SCRIPT ARGS`` (``argv``: the script and its args) in a new process group.

    ``watch``: the metric whose values are handed to ``should_stop(step, value)`` as they come (from
    ``proftune.report`` where the script calls it, else its stdout lines); True ends the script
    (SIGTERM, then SIGKILL after ``grace_s``): a pruned run. ``timeout_s``: seconds it may run;
    ``deadline``: the ``time.monotonic()`` at which it is cut (``cut``; SIGKILL after at most
    ``CUT_GRACE_S``), a budget's hard end. ``profile``: run it under the hooks of
    ``proftune run`` (its profile's metrics in ``.profile``). Any exception here (Ctrl-C, SIGTERM
    to proftune) ends the script before it propagates: no process is left behind."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="proftune-script-") as tmp:
        channel = Path(tmp) / "reports.jsonl"
        channel.touch()
        cmd = ([sys.executable, "-m", "proftune.script._child", *argv] if profile
               else [sys.executable, *argv])
        run = ScriptRun(command=[sys.executable, *argv])
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        reads = _Reads(watch)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, bufsize=1, start_new_session=True, errors="replace",
                                env=child_env({REPORT_ENV: str(channel), "PYTHONUNBUFFERED": "1"}))
        lines: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
        reader.start()
        offset = 0
        try:
            done = False
            while not done:
                try:
                    line = lines.get(timeout=0.1)
                except queue.Empty:
                    line = ""
                if line is None:
                    done = True
                elif line:
                    tail.append(line.rstrip("\n"))
                    if echo is not None:
                        echo.write(line)
                    values = metric_lines(line)
                    if values:
                        step = next((int(v) for k, v in values.items() if k.lower() in _STEP_KEYS
                                     and math.isfinite(v)), None)
                        reads.add("stdout", {k: v for k, v in values.items() if k.lower() not in _STEP_KEYS}, step)
                offset = _read_channel(channel, offset, reads)
                if should_stop is not None and not run.pruned:
                    if _check(reads, should_stop):
                        run.pruned = True
                        _end(proc, grace_s)
                if timeout_s is not None and time.perf_counter() - started > timeout_s and proc.poll() is None:
                    run.interrupted = f"the time limit ({timeout_s:g} s)"
                    _end(proc, grace_s)
                if deadline is not None and time.monotonic() >= deadline and proc.poll() is None:
                    run.interrupted, run.cut = "the budget's end", True
                    _end(proc, min(grace_s, CUT_GRACE_S))
            proc.wait()
            _read_channel(channel, offset, reads)
        except BaseException:
            _end(proc, grace_s)
            raise
        finally:
            reader.join(timeout=1.0)
            with contextlib.suppress(Exception):
                proc.stdout.close()
    run.exit_code = proc.returncode
    run.tail = list(tail)
    run.profile = reads.profile
    for source in reversed(SOURCES):  # the preferred source's values win
        for k, v in reads.by_source[source].items():
            if source == "stdout" and k != watch and not _METRIC_NAME.search(k):
                continue  # ``using: 0``, ``max_epochs=2``: a line's words, not the script's metrics
            run.metrics[k] = v
            run.sources[k] = source
    run.history = [(s, v) for src, s, v in reads.new if src == _source_of(reads)]
    run.duration_s = time.perf_counter() - started
    return run


def _source_of(reads: _Reads) -> str:
    return next((s for s in SOURCES if reads.counts.get(s)), "stdout")


def _check(reads: _Reads, should_stop: Callable[[int, float], bool]) -> bool:
    """Hand the watched metric's new values (from the preferred source only) to ``should_stop``."""
    source = _source_of(reads)
    pending = [(s, v) for src, s, v in reads.new[reads.handed:] if src == source]
    reads.handed = len(reads.new)
    stop = False
    for step, value in pending:
        stop = should_stop(step, value) or stop
    return stop


def _read_channel(channel: Path, offset: int, reads: _Reads) -> int:
    """Read the report lines written since ``offset``; the new offset (a partial line waits)."""
    with open(channel, "rb") as fh:
        fh.seek(offset)
        chunk = fh.read()
    end = chunk.rfind(b"\n")
    if end < 0:
        return offset
    for raw in chunk[:end].decode("utf-8", errors="replace").splitlines():
        try:
            msg: ChannelLine = json.loads(raw)
        except ValueError:
            continue
        if "profile" in msg:
            reads.profile = {k: float(v) for k, v in msg["profile"].items()}
            continue
        vals = {str(k): float(v) for k, v in (msg.get("metrics") or {}).items()}
        source = msg.get("source", "proftune.report")
        reads.add(source if source in SOURCES else "proftune.report", vals, msg.get("step"))
    return offset + end + 1
