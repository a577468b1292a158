"""What this machine holds for more processes: available memory, this process's resident size,
its cores. Read from Linux's ``/proc`` and cgroup files; None where a figure is not known (another
OS, no such file), and a bound from an unknown figure is not applied."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["available_memory_bytes", "cores", "resident_bytes", "worker_bound"]

#: More worker processes than this many per core each get a small fraction of one: the same
#: trials end sooner with fewer.
WORKERS_PER_CORE = 4


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def available_memory_bytes() -> int | None:
    """Memory a new process can take: ``MemAvailable`` of ``/proc/meminfo``, or less where this
    process's cgroup (v2) has a limit (``memory.max`` less ``memory.current``)."""
    avail: int | None = None
    text = _read("/proc/meminfo")
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    cg = _read("/proc/self/cgroup") or ""
    rel = next((line.split(":", 2)[2] for line in cg.splitlines() if line.startswith("0::")), None)
    if rel is not None:
        base = f"/sys/fs/cgroup{rel.strip()}"
        limit, used = _read(f"{base}/memory.max"), _read(f"{base}/memory.current")
        if limit and used and limit.strip().isdigit() and used.strip().isdigit():
            left = max(0, int(limit) - int(used))
            avail = left if avail is None else min(avail, left)
    return avail


def resident_bytes() -> int | None:
    """This process's resident memory (``/proc/self/statm``)."""
    text = _read("/proc/self/statm")
    if not text:
        return None
    return int(text.split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_bound(workers: int, *, rss: int | None, available: int | None, n_cores: int) -> str | None:
    """Why ``workers`` processes like this one do not fit this machine, with the figures (None: they
    fit). Each worker imports what this process has (torch, the task), so it holds about ``rss``;
    ``available``: memory free for them; ``n_cores``: the cores they share."""
    from ._units import format_bytes

    if rss and available is not None and workers * rss > available:
        most = max(1, available // rss)
        return (f"{workers} workers need ~{format_bytes(workers * rss)} ({format_bytes(rss)} each: this process's "
                f"resident size, which every worker repeats) but {format_bytes(available)} is available "
                f"(/proc/meminfo and the cgroup's limit): at most {most} fit; valid: 1 to {most}")
    if workers > WORKERS_PER_CORE * n_cores:
        most = WORKERS_PER_CORE * n_cores
        return (f"{workers} workers on {n_cores} core(s) would each get {n_cores / workers:.2g} of a core: the same "
                f"trials end sooner with fewer; valid: 1 to {most} ({WORKERS_PER_CORE} per core)")
    return None
