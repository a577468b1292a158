"""Output paths: checked before any work, never overwritten or followed without ``force``.

Every command that writes a file or a folder the user names (``--out``, ``--trace``,
``--report``, ``--plot``, ``--tensorboard``, ...) checks it here first, so a bad path is an exit 2
before minutes of work instead of a traceback after them:

- a file's folder must exist and be writable (probed by creating and removing a file in it:
  permission bits say nothing for root, nor for ``/proc``);
- a folder output may not exist yet (it is created with its parents), but the nearest existing
  folder above it must be writable;
- an existing file, or a symbolic link, is replaced only with ``force``; a link is then replaced
  itself (its target is never written through); a device, pipe or socket is never replaced.

Writers then go through :func:`replacing`: the data lands in a temporary file beside the target
and is renamed over it, so a crash never leaves half a file and a link is never followed; a write
that fails (a full disk) is an :class:`OutputWriteError` naming the file and the free space left.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .exceptions import OutputWriteError, ProblemCollector

__all__ = ["OutputPath", "check_outputs", "free_bytes", "output_problems", "replacing", "write_failed", "write_text"]


@dataclass(frozen=True)
class OutputPath:
    """One output a command will write: the option that names it (``--trace`` in the CLI, the
    Python argument ``trace=`` in the library, which the CLI reads as its flag), the path, whether
    it is a folder, and (a folder) the names of the files it will write there."""

    option: str
    path: str | Path | None
    folder: bool = False
    names: Sequence[str] = ()


def output_problems(out: OutputPath, *, force: bool) -> list[str]:
    """What stops ``out`` from being written (each problem one sentence); empty when it can be."""
    if out.path is None or str(out.path) == "":
        return []
    path = Path(out.path)
    shown = f"{out.option}{str(path)!r}" if out.option.endswith("=") else f"{out.option} {str(path)!r}"
    loop = _symlink_loop(path)
    if loop is not None:
        return [f"{shown}: {str(loop)!r} is a loop of symbolic links; choose another path."]
    link = _link_problem(path, shown, force=force, folder=out.folder)
    if link is not None:
        return [link]
    if out.folder:
        return _folder_problems(path, shown, force=force, names=out.names)
    return _file_problems(path, shown, force=force)


def check_outputs(outputs: Iterable[OutputPath], *, force: bool = False,
                  problems: ProblemCollector | None = None) -> None:
    """Check every output before any work; raise one :class:`ConfigError` naming every problem
    (or add them to ``problems``). Two options naming one path are a problem too."""
    collected = problems if problems is not None else ProblemCollector()
    seen: dict[str, str] = {}
    for out in outputs:
        if out.path is None or str(out.path) == "":
            continue
        key = os.path.abspath(os.fspath(out.path))
        if key in seen:
            collected.add(f"{seen[key]} and {out.option} name the same path {str(out.path)!r}; "
                          "give each its own.")
            continue
        seen[key] = out.option
        for problem in output_problems(out, force=force):
            collected.add(problem)
    if problems is None and collected:
        collected.raise_if_any(header="the output paths cannot be used, found the following problems:"
                               if len(collected.problems) > 1 else None)


def _symlink_loop(path: Path) -> Path | None:
    """The first folder on the way to ``path`` (or ``path``) that is a loop of symbolic links
    (``Path.exists`` reads one as absent, so the folder checks alone would let it through)."""
    for probe in [*reversed(path.parents), path]:
        try:
            os.stat(probe)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return probe
    return None


def _link_problem(path: Path, shown: str, *, force: bool, folder: bool) -> str | None:
    if not path.is_symlink():
        return None
    if force:
        return None
    target = os.readlink(path)
    what = ("written into" if folder else "followed nor replaced")
    return (f"{shown} is a symbolic link (to {target!r}); it is neither {what} without force=True"
            + ("." if folder else " (with it the link itself is replaced; its target is left as it is)."))


def _file_problems(path: Path, shown: str, *, force: bool) -> list[str]:
    if path.is_dir() and not path.is_symlink():
        return [f"{shown} is a folder; give the name of a file (in it or elsewhere)."]
    if path.exists() or path.is_symlink():
        mode = path.lstat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            return [f"{shown} exists and is not a regular file (a device, pipe or socket); "
                    "it is never replaced: choose another path."]
        if not force and not stat.S_ISLNK(mode):
            return [f"{shown} exists; pass force=True to replace it, or choose another path."]
    folder = path.parent
    if not folder.exists():
        above = _nearest_existing(folder)
        if above is not None and not above.is_dir():
            return [f"{shown}: {str(above)!r} is a file, not a folder."]
        return [f"{shown}: folder {str(folder)!r} does not exist; create it first or choose another path."]
    if not folder.is_dir():
        return [f"{shown}: {str(folder)!r} is a file, not a folder."]
    reason = _unwritable(folder)
    if reason is not None:
        return [f"{shown}: folder {str(folder)!r} is not writable ({reason})."]
    return []


def _folder_problems(path: Path, shown: str, *, force: bool, names: Sequence[str]) -> list[str]:
    if path.exists():
        if not path.is_dir():
            return [f"{shown} is a file, not a folder."]
        reason = _unwritable(path)
        if reason is not None:
            return [f"{shown} is not a writable folder ({reason})."]
        taken = [n for n in names if (path / n).exists() or (path / n).is_symlink()]
        if taken and not force:
            return [f"{shown} already holds {', '.join(taken)}; pass force=True to replace "
                    f"{'it' if len(taken) == 1 else 'them'}, or choose another folder."]
        return []
    above = _nearest_existing(path)
    if above is None or not above.is_dir():
        where = "nothing above it exists" if above is None else f"{str(above)!r} is a file, not a folder"
        return [f"{shown} cannot be created: {where}."]
    reason = _unwritable(above)
    if reason is not None:
        return [f"{shown} cannot be created: {str(above)!r} is not writable ({reason})."]
    return []


def _nearest_existing(path: Path) -> Path | None:
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return None
        probe = probe.parent
    return probe


def _unwritable(folder: Path) -> str | None:
    """Why a file cannot be created in ``folder`` (None: it can), found by creating one: the
    permission bits are not the answer for root, a read-only mount or ``/proc``."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".proftune-probe-")
    except OSError as exc:
        if exc.errno == errno.ENOENT:  # the folder exists: a pseudo file system such as /proc
            return "no file can be created there"
        return exc.strerror or type(exc).__name__
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)
    return None


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so writers that infer the format from it
    work) that replaces ``path`` when the block succeeds and is removed when it fails. A
    symbolic link at ``path`` is replaced itself, never written through. A writer that reports
    success but leaves no file (``torch.profiler``'s trace export logs and returns) is a failure."""
    target = Path(path)
    tmp = target.with_name(f".{target.stem}-{secrets.token_hex(4)}{target.suffix}")
    try:
        yield tmp
        if not tmp.exists():
            raise OSError(f"writing {str(target)!r} produced no file")
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()  # first: the free space said is what the failed write leaves
        raise write_failed(target, exc) from exc
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def free_bytes(path: str | Path) -> int | None:
    """Bytes free to this user on the device holding ``path`` (its nearest existing folder);
    None where the system cannot say."""
    folder = _nearest_existing(Path(path).absolute())
    if folder is None:
        return None
    try:
        return int(shutil.disk_usage(folder).free)
    except OSError:
        return None


def write_failed(path: str | Path, exc: OSError) -> OutputWriteError:
    """The error of a failed write of ``path``: the file, the system's reason and the free space
    of its device (a full disk reads as such, not as a bare ``[Errno 28]``)."""
    free = free_bytes(path)
    reason = exc.strerror or str(exc) or type(exc).__name__
    room = "" if free is None else f"; {free} bytes free on its device"
    full = " (no space left on the device)" if exc.errno == errno.ENOSPC and "space" not in reason else ""
    return OutputWriteError(f"writing {str(path)!r} failed: {reason}{full}{room}", path=str(path), free_bytes=free,
                            errno=exc.errno)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically through :func:`replacing`; returns the path."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
