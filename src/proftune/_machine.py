"""What this machine holds for more processes: available memory, this process's resident size,
its cores, a free port. Read from Linux's ``/proc`` and cgroup files; None where a figure is not known (another
OS, no such file), and a bound from an unknown figure is not applied."""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["available_memory_bytes", "cores", "free_port", "resident_bytes", "worker_bound"]

#: More worker processes than this many per core each get a small fraction of one: the same
#: trials end sooner with fewer.
WORKERS_PER_CORE = 4


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def available_memory_bytes(*, root: str = "") -> int | None:
    """Memory a new process can take: ``MemAvailable`` of ``/proc/meminfo``, or less where this
    process's cgroup has a limit: v2 (``memory.max`` less ``memory.current``) or v1 (the memory
    controller's ``memory.limit_in_bytes`` less ``memory.usage_in_bytes``). ``root``: a folder
    standing for ``/`` (tests)."""
    avail: int | None = None
    text = _read(f"{root}/proc/meminfo")
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    for left in _cgroup_left(root):
        avail = left if avail is None else min(avail, left)
    return avail


def _cgroup_left(root: str) -> list[int]:
    """Bytes left under each memory limit of this process's cgroups (v2 and v1)."""
    out = []
    for line in (_read(f"{root}/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":  # v2: one unified hierarchy
            base = f"{root}/sys/fs/cgroup{rel.strip()}"
            files = (f"{base}/memory.max", f"{base}/memory.current")
        elif "memory" in controllers.split(","):  # v1: the memory controller's own hierarchy
            base = f"{root}/sys/fs/cgroup/memory{rel.strip()}"
            files = (f"{base}/memory.limit_in_bytes", f"{base}/memory.usage_in_bytes")
        else:
            continue
        limit, used = _read(files[0]), _read(files[1])
        if limit and used and limit.strip().isdigit() and used.strip().isdigit():
            out.append(max(0, int(limit) - int(used)))
    return out


def resident_bytes() -> int | None:
    """This process's resident memory (``/proc/self/statm``)."""
    text = _read("/proc/self/statm")
    if not text:
        return None
    return int(text.split()[1]) * os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    # one range, the smaller of the two bounds, in every refusal (issue 62: "valid: 1 to 37", then 8)
    by_memory = max(1, available // rss) if rss and available is not None else None
    by_cores = WORKERS_PER_CORE * n_cores
    most = min(by_memory, by_cores) if by_memory is not None else by_cores
    if by_memory is not None and rss and available is not None and workers * rss > available:
        return (f"{workers} workers need ~{format_bytes(workers * rss)} ({format_bytes(rss)} each: this process's "
                f"resident size, which every worker repeats) but {format_bytes(available)} is available "
                f"(/proc/meminfo and the cgroup's limit): at most {by_memory} fit; valid: 1 to {most}"
                + (f" ({WORKERS_PER_CORE} per core)" if most < by_memory else ""))
    if workers > by_cores:
        return (f"{workers} workers on {n_cores} core(s) would each get {n_cores / workers:.2g} of a core: the same "
                f"trials end sooner with fewer; valid: 1 to {most} ({WORKERS_PER_CORE} per core"
                + (f", {by_memory} by memory)" if by_memory is not None and by_memory < by_cores else ")"))
    return None
