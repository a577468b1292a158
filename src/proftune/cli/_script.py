"""A training script on the command line: ``proftune tune|optimize [OPTIONS] -- python train.py ARGS``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..exceptions import ConfigError

__all__ = ["is_script", "script_command", "split_tail"]


def is_script(task: str | None) -> bool:
    """TASK is a Python interpreter: what follows ``--`` is a script to run."""
    return task is not None and Path(task).name.startswith("python")


def script_command(task: str | None, extra: Sequence[str], *, command: str) -> list[str] | None:
    """``[python, train.py, ARGS...]`` where TASK names an interpreter; None for a task spec (which
    takes no extra arguments)."""
    if is_script(task):
        assert task is not None
        return [task, *extra]
    if extra:
        raise ConfigError(f"unexpected arguments after TASK: {' '.join(extra)!r}; a script goes after --: "
                          f"`proftune {command} [OPTIONS] -- python train.py ARGS`.")
    return None


def split_tail(cmd: list[str], script_options: set[str], ours: Mapping[str, str]) -> tuple[list[str], dict[str, Any]]:
    """Take proftune's own options off the end of a script's command line where the script has no
    such option (``-- python train.py --lr 0.1 --objective val_acc:max``): the command left, and
    the options taken (``ours``: option -> ``flag``, ``value`` or ``list``)."""
    out: list[str] = []
    taken: dict[str, Any] = {}
    i = 0
    head = 2 if len(cmd) > 1 and cmd[1] != "-m" else 3
    out.extend(cmd[:head])
    while i + head < len(cmd):
        tok = cmd[i + head]
        opt, eq, val = tok.partition("=")
        kind = ours.get(opt)
        if kind is None or opt in script_options:
            out.append(tok)
            i += 1
            continue
        if kind == "flag":
            taken[opt] = True
            i += 1
            continue
        if not eq:
            if i + head + 1 >= len(cmd):
                raise ConfigError(f"{opt} needs a value (after the script, proftune's {opt} takes one).")
            val = cmd[i + head + 1]
            i += 1
        i += 1
        if kind == "list":
            taken.setdefault(opt, []).append(val)
        else:
            taken[opt] = val
    return out, taken
