"""The environment a run ran in: Python, torch, CUDA/cuDNN, device, CPU, memory, git commit."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


#: Seconds a git commit read for one folder stands for runs started after it: a loop records a run
#: a second (each read is two ``git`` processes, 30-60 ms on a loaded machine).
GIT_TTL_S = 10.0
_GIT: dict[str, tuple[float, str | None]] = {}


def _git_commit(cwd: str | None = None) -> str | None:
    """HEAD of the repository the process runs in (``-dirty`` with tracked changes), or None."""
    key = os.path.abspath(cwd or os.getcwd())
    now = time.monotonic()
    hit = _GIT.get(key)
    if hit is not None and now - hit[0] < GIT_TTL_S:
        return hit[1]
    commit = _read_git_commit(cwd)
    _GIT[key] = (now, commit)
    return commit


def _read_git_commit(cwd: str | None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    commit = out.stdout.strip()
    try:
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd, capture_output=True, text=True, timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        dirty = ""
    return commit + ("-dirty" if dirty else "")


@functools.cache
def _versions_read() -> tuple[tuple[str, str], ...]:
    from importlib import metadata

    out: dict[str, str] = {}
    for name in ("proftune", "numpy", "optuna", "torchvision", "torch-pruning", "torchao", "scikit-learn"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return tuple(out.items())


def _versions() -> dict[str, str]:
    """The versions of the packages a run's results depend on, read once a process (what it imported
    stays what it runs, whatever is installed after)."""
    return dict(_versions_read())


def environment(device: str | torch.device | None = None) -> dict[str, object]:
    """A JSON-serialisable description of this machine and its software, for the run record."""
    dev = torch.device(device) if device is not None else None
    env: dict[str, object] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "device": str(dev) if dev is not None else None,
        "device_name": None,
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_bytes": _memory_bytes(),
        "git_commit": _git_commit(),
        "packages": _versions(),
    }
    if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        env["device_name"] = props.name
        env["device_memory_bytes"] = int(props.total_memory)
    elif dev is not None:
        env["device_name"] = env["cpu"]
    return env
