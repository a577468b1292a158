"""The CPU thread count as a computed parameter: measured on real training steps, re-checked.

On a shared machine torch's default (one intra-op thread per core) can make a step many times
slower than one thread, because the threads wait on each other while other processes hold the
cores; on a quiet machine more threads are faster. :class:`ThreadTuner` decides from the step
times it is given: it tries the candidate counts (1, 2, 4, ... up to :func:`max_threads`) for a
few steps each, keeps the fastest, and measures again when the median step time of a window
drifts from the chosen count's measured one, or after a number of steps that doubles while the
choice holds. Where the training thread's steps waited for a core held by others
(:func:`run_queue_ms`), larger counts are not tried: their threads would wait too. The steps it
measures are the training's own steps; the fit loop (``train.fit``) feeds it.

Several workers on one machine share its cores: :func:`share_cores` sets the count this process
may use (``$PROFTUNE_MAX_THREADS``, inherited by the processes it starts). ``$PROFTUNE_THREADS``
fixes the count (the CLI's ``--threads N``), as ``FitConfig(threads=N)`` does.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from ._records import JsonRecord, each
from .exceptions import ConfigError

__all__ = [
    "MAX_THREADS_ENV",
    "THREADS_ENV",
    "ThreadCheck",
    "ThreadChoice",
    "ThreadTuner",
    "candidate_counts",
    "fit_key",
    "fixed_threads",
    "forget",
    "limit_threads",
    "machine_cores",
    "max_threads",
    "others_running",
    "recall",
    "remember",
    "run_queue_ms",
    "share_cores",
    "threads_from_env",
    "work_threads",
]

#: A fixed thread count for every fit of this process and the processes it starts (``--threads``).
THREADS_ENV = "PROFTUNE_THREADS"
#: The most threads this process may use: its share of the cores (set by :func:`share_cores`).
MAX_THREADS_ENV = "PROFTUNE_MAX_THREADS"


def _cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask
        return max(1, os.cpu_count() or 1)


def max_threads() -> int:
    """The most intra-op threads a fit here may use: ``$PROFTUNE_MAX_THREADS`` when a worker's
    share was set, else the cores of this process's affinity mask."""
    text = os.environ.get(MAX_THREADS_ENV)
    if text:
        try:
            return max(1, int(text))
        except ValueError:
            raise ConfigError(f"${MAX_THREADS_ENV}={text!r} must be a whole number of threads.") from None
    return _cores()


def share_cores(workers: int) -> int:
    """The cores this process may use (:func:`max_threads`) divided among ``workers`` processes
    that run at once: the share one gets (at least 1). A worker calls :func:`limit_threads` with it."""
    return max(1, max_threads() // max(1, int(workers)))


def limit_threads(threads: int) -> None:
    """Cap this process (and those it starts) at ``threads``: a worker's share of the cores."""
    os.environ[MAX_THREADS_ENV] = str(max(1, int(threads)))


def threads_from_env() -> int | None:
    """``$PROFTUNE_THREADS`` as a count (the CLI's ``--threads``), or None when it is not set."""
    text = os.environ.get(THREADS_ENV)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"${THREADS_ENV}={text!r} must be a whole number of threads >= 1.")
    return value


@contextlib.contextmanager
def fixed_threads(threads: int | None) -> Iterator[None]:
    """Within the block every fit of this process (and of the processes it starts) trains at
    ``threads`` (None: computed); the environment is put back after."""
    if threads is None:
        yield
        return
    if isinstance(threads, bool) or int(threads) < 1:
        raise ConfigError(f"threads must be a whole number >= 1, but got {threads=}.")
    before = os.environ.get(THREADS_ENV)
    os.environ[THREADS_ENV] = str(int(threads))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = before


def candidate_counts(limit: int) -> list[int]:
    """1, 2, 4, ... below ``limit``, and ``limit`` itself."""
    out, n = [], 1
    while n < limit:
        out.append(n)
        n *= 2
    return [*out, max(1, limit)]


def run_queue_ms() -> float | None:
    """Milliseconds the calling thread has waited so far for a core held by others (Linux's
    ``/proc/thread-self/schedstat``: time runnable but not running); None where the OS does not
    say. Waiting on a sleep, a disk or a GPU is not counted: only other processes holding the cores."""
    global _SCHEDSTAT
    if not _SCHEDSTAT:
        return None
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e6
    except (OSError, ValueError, IndexError):
        _SCHEDSTAT = False
        return None


_SCHEDSTAT = True


def machine_cores() -> int | None:
    """The machine's cores where this process may run on all of them (then the threads other
    processes run, :func:`others_running`, compete for ours); None where its affinity mask holds
    fewer (the others may run on cores it cannot use) or the OS does not say."""
    total = os.cpu_count()
    return total if total and _cores() == total else None


def others_running(own: int = 1) -> int | None:
    """Threads of other processes runnable on the machine right now (Linux's ``/proc/loadavg``:
    the runnable count, less ``own``: this process's threads that may be running); None where
    the OS does not say. Sampled around each step: where the others hold all cores but one, a
    second thread of ours waits for a core at every parallel region (many times slower)."""
    global _LOADAVG
    if not _LOADAVG:
        return None
    try:
        with open("/proc/loadavg") as f:
            return max(0, int(f.read().split()[3].split("/")[0]) - max(1, own))
    except (OSError, ValueError, IndexError):
        _LOADAVG = False
        return None


_LOADAVG = True


@dataclass(frozen=True)
class ThreadCheck(JsonRecord):
    """One measurement of the candidates: when it began (the fit's step), why (``start``,
    ``drift``: the step time moved, ``periodic``), each candidate's median step time (ms; a
    candidate stopped after one step slower than ``abort`` x the best has that step's time),
    the candidates not measured (a smaller count was already slower, or its steps waited for
    cores held by others: ``wait_share``), and the one chosen."""

    WHAT: ClassVar[str] = "a thread check"

    step: int
    reason: str
    step_ms: dict[str, float]
    chosen: int
    skipped: list[int] = field(default_factory=list)
    #: For ``drift``: the window's median step time (ms) against the one at the choice.
    drift_ms: list[float] = field(default_factory=list)
    #: Per measured count, the share of its steps' time the training thread waited for a core
    #: (run queue; Linux). Above ``busy`` the larger counts are skipped: their threads would wait too.
    wait_share: dict[str, float] = field(default_factory=dict)
    #: Per measured count, the median number of other processes' threads runnable around its
    #: steps (Linux), where the tuner knows the machine's cores: larger counts than the cores
    #: the others leave free are skipped (their threads would wait for a core).
    others: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ThreadChoice(JsonRecord):
    """The thread count a fit trained at, and its evidence: ``source`` is ``user`` (a fixed
    value: ``given_by`` says where, ``threads=`` or ``$PROFTUNE_THREADS``) or ``computed``
    (``checks`` hold the measurements); ``threads`` is the count at the end, ``max_threads``
    the share of the cores it could use, ``remembered`` whether it started from an earlier fit's
    choice in this process (``checks`` then start later)."""

    WHAT: ClassVar[str] = "a thread choice"
    READERS: ClassVar[dict] = {"checks": each(ThreadCheck.from_dict)}

    threads: int
    source: str
    max_threads: int
    candidates: list[int] = field(default_factory=list)
    checks: list[ThreadCheck] = field(default_factory=list)
    given_by: str = ""
    remembered: bool = False
    #: Steps trained at each count (``{"1": 40, "2": 3}``).
    steps_at: dict[str, int] = field(default_factory=dict)

    @property
    def step_ms(self) -> dict[str, float]:
        """The latest measured median step time (ms) of each candidate."""
        out: dict[str, float] = {}
        for check in self.checks:
            out.update(check.step_ms)
        return out


class ThreadTuner:
    """Which thread count the next step runs at, from the step times of the steps before it.

    Feed it with :meth:`observe` (the last step's milliseconds, run at :attr:`threads`, and the
    milliseconds of it the training thread waited for a core). A check measures the candidates
    in ascending order for ``steps`` steps each; a candidate whose step takes more than ``abort``
    x the best median so far is stopped after that step, and the climb stops at the first count
    slower than the best, or at a count whose steps waited for a core more than ``busy`` of their
    time (the cores are held by others: more threads would wait for them, and on a shared machine
    that is where a step at torch's default is many times slower); where it knows the machine's
    ``cores``, counts above the cores other processes' runnable threads leave free (``others``,
    the median around the last count's steps) are not tried either. It chooses the smallest count
    within ``tie`` of the fastest (fewer threads leave cores to others and wait less).

    Then the median of each window of ``window`` steps is compared with the chosen count's
    measured time: a move by more than ``drift`` (0.5: half) measures again where a change can
    help: a slower step (the machine got busier) the smaller counts, a faster one the larger
    counts (unless the window's steps waited for cores); with none to measure, the window is the
    new reference. So does the ``recheck``-th step after the choice (every count; doubled while
    the choice holds, and at least the steps over which the last check's extra time, its steps at
    the other counts beyond the chosen one's, is ``cost_share`` of the training; at most
    ``max_recheck``).

    Outside a check the load (the wait and the others' threads) is read around one step in
    ``load_every`` (:meth:`wants_load`; each read opens a file under /proc, about a tenth of a
    millisecond, as much as a small model's whole step): a window's figure is the median of the
    steps it was read around.
    """

    def __init__(self, candidates: list[int], *, start: int | None = None, recheck: int = 64,
                 steps: int = 3, window: int = 8, drift: float = 0.5, abort: float = 3.0, tie: float = 0.1,
                 busy: float = 0.2, max_recheck: int = 1024, warmup: int = 1, since: int = 0,
                 cost_share: float = 0.02, cores: int | None = None, load_every: int = 4) -> None:
        self.candidates = sorted(set(candidates))
        self.steps_per, self.window_size, self.drift, self.abort, self.tie = steps, window, drift, abort, tie
        self.busy, self.cores, self.load_every = busy, cores, max(1, load_every)
        self.base_recheck, self.max_recheck, self.cost_share = recheck, max_recheck, cost_share
        self.recheck = recheck
        self.checks: list[ThreadCheck] = []
        self.steps_at: dict[int, int] = {}
        self.step = 0
        self._warmup = warmup
        self._window: deque[float] = deque(maxlen=window)
        # (the step since the last check, the figure) of the steps the load was read around
        self._waits: deque[tuple[int, float]] = deque(maxlen=window)
        self._others: deque[tuple[int, float]] = deque(maxlen=window)
        self._since = since if start is not None else 0
        self._ref: float | None = None
        self._drift_gap = 2 * window
        self._measuring: _Check | None = None
        self.remembered = start is not None and start in self.candidates
        self.threads = start if self.remembered and start is not None else self.candidates[0]
        if not self.remembered and len(self.candidates) > 1:
            self._begin("start", order=list(self.candidates))

    @property
    def since(self) -> int:
        """Steps trained since the last check ended."""
        return self._since

    @property
    def measuring(self) -> bool:
        return self._measuring is not None

    def wants_load(self) -> bool:
        """Whether the next step's load is read (its wait for a core, the others' runnable
        threads): every step a check measures, one in ``load_every`` between checks."""
        if self._measuring is not None:
            return self._warmup == 0
        return (self._since + 1) % self.load_every == 0

    def cut_off(self) -> tuple[float, int] | None:
        """While a candidate is measured after a faster one: the milliseconds after which its step
        is already too slow (``abort`` x the best median so far) and the best count, which the
        rest of that step may run at (:meth:`observe` with ``cut=True``). Else None."""
        m = self._measuring
        if m is None or not m.done or self._warmup > 0:
            return None
        best = min(m.done, key=lambda c: m.done[c])
        return (self.abort * m.done[best], best) if best != self.threads else None

    def observe(self, step_ms: float, *, cut: bool = False, wait_ms: float | None = None,
                others: float | None = None) -> None:
        """The step just run took ``step_ms`` at :attr:`threads` (``cut``: it went on at the best
        count once it took too long; ``wait_ms``: of it, the training thread waited for a core,
        None: not known; ``others``: other processes' threads runnable around it, None: not
        known); :attr:`threads` is the next step's."""
        self.step += 1
        self.steps_at[self.threads] = self.steps_at.get(self.threads, 0) + 1
        if self._warmup > 0:  # the first step of a fit builds its buffers: it says nothing of threads
            self._warmup -= 1
            return
        wait = None if wait_ms is None or step_ms <= 0 else min(1.0, max(0.0, wait_ms / step_ms))
        if self._measuring is not None:
            self._measure(step_ms, wait, others, cut=cut)
            return
        self._window.append(step_ms)
        self._since += 1
        if wait is not None:
            self._waits.append((self._since, wait))
        if others is not None:
            self._others.append((self._since, others))
        if len(self.candidates) < 2 or len(self._window) < self.window_size or self._since % self.window_size:
            return
        median = statistics.median(self._window)
        waited, held = self._window_median(self._waits), self._window_median(self._others)
        if self._ref is None:
            self._ref = median
        elif abs(median - self._ref) > self.drift * self._ref and self._since >= self._drift_gap:
            slower = median > self._ref
            order = [c for c in self.candidates if (c < self.threads if slower else c > self.threads)]
            if waited is not None and waited > self.busy:
                order = [c for c in order if c < self.threads]
            order = [c for c in order if c <= self._free(held)]
            if order:
                self._begin("drift", order=order, prefilled=(median, waited, held), drift_ms=[median, self._ref])
                return
            self._ref = median  # nothing a change could help: the machine's new pace is the reference
        if self._since >= self.recheck:
            order = [c for c in self.candidates if c != self.threads]
            if waited is not None and waited > self.busy:
                order = [c for c in order if c < self.threads]
            order = [c for c in order if c <= self._free(held)]
            self._begin("periodic", order=order, prefilled=(median, waited, held))

    def _window_median(self, sampled: deque[tuple[int, float]]) -> float | None:
        """The median of the figures read around this window's steps; None where none was."""
        inside = [v for at, v in sampled if at > self._since - self.window_size]
        return statistics.median(inside) if inside else None

    def _free(self, others: float | None) -> int:
        """The most threads worth trying while ``others`` of other processes' threads are
        runnable: the cores they leave free (at least 1); every count where that is not known."""
        if others is None or self.cores is None:
            return max(self.candidates)
        return max(1, self.cores - math.ceil(others))

    def _begin(self, reason: str, *, order: list[int],
               prefilled: tuple[float, float | None, float | None] | None = None,
               drift_ms: list[float] | None = None) -> None:
        done: dict[int, float] = {}
        waits: dict[int, float] = {}
        held: dict[int, float] = {}
        if prefilled is not None:
            done[self.threads] = prefilled[0]
            if prefilled[1] is not None:
                waits[self.threads] = prefilled[1]
            if prefilled[2] is not None:
                held[self.threads] = prefilled[2]
        skipped = [c for c in self.candidates if c not in order and c not in done]
        m = _Check(reason=reason, at=self.step, order=order, done=done, drift_ms=drift_ms or [],
                   previous=None if reason == "start" else self.threads, waits=waits, skipped=skipped,
                   held=held)
        self._measuring = m
        if order:
            self.threads = order[0]
        else:
            self._finish(m)

    def _measure(self, step_ms: float, wait: float | None, others: float | None, *, cut: bool) -> None:
        m = self._measuring
        assert m is not None
        m.times.append(step_ms)
        if wait is not None:
            m.wait_times.append(wait)
        if others is not None:
            m.others_times.append(others)
        m.spent.append((self.threads, step_ms))
        best = min(m.done.values()) if m.done else None
        aborted = cut or (best is not None and step_ms > self.abort * best)
        if len(m.times) < self.steps_per and not aborted:
            return
        value = max(m.times) if aborted else statistics.median(m.times)
        m.done[self.threads] = value
        if len(m.wait_times) == len(m.times):
            m.waits[self.threads] = statistics.median(m.wait_times)
        if len(m.others_times) == len(m.times):
            m.held[self.threads] = statistics.median(m.others_times)
        m.times, m.wait_times, m.others_times = [], [], []
        m.order.pop(0)
        best_count = min(m.done, key=lambda c: m.done[c])
        waited = m.waits.get(self.threads, 0.0) > self.busy
        if (value > m.done[best_count] * (1 + self.tie) and self.threads > best_count) or waited:
            # slower at more threads, or its steps waited for cores others hold: stop climbing
            m.skipped += [c for c in m.order if c > self.threads]
            m.order = [c for c in m.order if c < self.threads]
        free = self._free(m.held.get(self.threads))
        m.skipped += [c for c in m.order if c > free]  # the cores others hold: those threads would wait
        m.order = [c for c in m.order if c <= free]
        if m.order:
            self.threads = m.order[0]
            return
        self._finish(m)

    def _finish(self, m: _Check) -> None:
        fastest = min(m.done.values())
        chosen = min(c for c, v in m.done.items() if v <= fastest * (1 + self.tie))
        self.checks.append(ThreadCheck(step=m.at, reason=m.reason, chosen=chosen, skipped=sorted(set(m.skipped)),
                                       step_ms={str(c): round(v, 4) for c, v in sorted(m.done.items())},
                                       drift_ms=[round(v, 4) for v in m.drift_ms],
                                       wait_share={str(c): round(v, 3) for c, v in sorted(m.waits.items())},
                                       others={str(c): round(v, 2) for c, v in sorted(m.held.items())}))
        kept = m.previous is not None and chosen == m.previous
        # a check costs what its steps at the other counts took beyond the chosen one's; the next
        # periodic one comes when that is at most ``cost_share`` of the training between them
        excess = sum(max(0.0, ms - m.done[chosen]) for count, ms in m.spent if count != chosen)
        affordable = math.ceil(excess / (self.cost_share * m.done[chosen])) if m.done[chosen] > 0 else 0
        self.recheck = min(max(2 * self.recheck if kept else self.base_recheck, affordable), self.max_recheck)
        self._drift_gap = min(2 * self._drift_gap, self.max_recheck) if kept else 2 * self.window_size
        # the next windows are compared with the chosen count's measured time: a choice made on
        # a lucky moment is measured again as soon as its steps show it
        last = self._last_measured(m)
        self.threads = chosen
        self._measuring = None
        self._window.clear()
        self._waits.clear()
        self._others.clear()
        self._since = 0
        self._ref = m.done[chosen]
        self._warmup = 1 if m.spent and chosen != last else 0

    @staticmethod
    def _last_measured(m: _Check) -> int | None:
        return m.spent[-1][0] if m.spent else None


@dataclass
class _Check:
    reason: str
    at: int
    order: list[int]
    done: dict[int, float]
    drift_ms: list[float]
    previous: int | None
    waits: dict[int, float] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    wait_times: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    spent: list[tuple[int, float]] = field(default_factory=list)
    held: dict[int, float] = field(default_factory=dict)
    others_times: list[float] = field(default_factory=list)


#: The last completed choice per workload (task, device) in this process: a fit that follows one
#: within ``_MEMORY_S`` seconds starts at it (trials of a search, the seeds of a race) and checks
#: again at its periodic re-check instead of paying for a first measurement.
_MEMORY: dict[tuple[str, ...], tuple[int, int, int, float]] = {}
_MEMORY_S = 120.0


def remember(key: tuple[str, ...], threads: int, recheck: int, since: int) -> None:
    """Note the choice of a fit of the workload ``key``, its re-check interval and the steps
    trained since its last check (the next fit's periodic re-check counts on from there)."""
    _MEMORY[key] = (threads, recheck, since, time.monotonic())


def recall(key: tuple[str, ...]) -> tuple[int, int, int] | None:
    """The recent choice, re-check interval and steps since its check for ``key``, or None."""
    hit = _MEMORY.get(key)
    if hit is None or time.monotonic() - hit[3] > _MEMORY_S:
        return None
    return hit[0], hit[1], hit[2]


def fit_key(task: object, device_type: str) -> tuple[str, ...]:
    """The workload key under which the fit loop remembers its thread choice for ``task``."""
    return (getattr(task, "name", None) or type(task).__name__, device_type)


def threads_for_work(key: tuple[str, ...] | None) -> int | None:
    """torch's thread count for the work of ``key`` outside the fit loop's steps (evaluations,
    probes, range tests, gradient samples), or None to keep torch's own.

    ``$PROFTUNE_THREADS`` where set; else the count the fit loop last measured best for ``key``
    (:func:`recall`); else 1 where other processes' runnable threads hold all this machine's
    cores but one (:func:`others_running`): torch's default, a thread per core, then waits on busy
    cores at every parallel region (a small CNN's forward and backward at load 8 on 2 cores: 0.19
    s for 16 batches at one thread, 1-3.8 s at two). Within :func:`max_threads`."""
    fixed = threads_from_env()
    if fixed is not None:
        return min(fixed, max_threads())
    hit = recall(key) if key is not None else None
    if hit is not None:
        return min(hit[0], max_threads())
    cores = machine_cores()
    others = others_running(1)
    if cores is not None and others is not None and others >= cores - 1:
        return 1
    return None


@contextlib.contextmanager
def work_threads(key: tuple[str, ...] | None) -> Iterator[None]:
    """Within the block torch runs at :func:`threads_for_work`'s count for ``key`` (read once, as
    it begins); the count before is put back after (the fit loop sets its own per step)."""
    import torch

    want = threads_for_work(key)
    before = torch.get_num_threads()
    if want is not None and want != before:
        torch.set_num_threads(want)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def forget() -> None:
    """Drop every remembered choice (a benchmark's cases, tests)."""
    _MEMORY.clear()
