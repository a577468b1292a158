"""A training script on the command line: ``proftune tune|optimize [OPTIONS] -- python train.py ARGS``."""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigError
from ._common import err_console
from ._script_args import is_script

if TYPE_CHECKING:
    from ..script import ScriptFlags

__all__ = ["command_started", "optimize_on_script", "script_command", "split_tail", "tune_on_script"]

#: Whether this process is the command (the console script, ``python -m proftune``): set by ``main``.
AS_MAIN = False


def command_started() -> float:
    """The ``time.monotonic()`` at which the command started: this process's start where it is the
    command (its imports and the reading of a script's flags count against a budget, the user's wall
    clock), else now (a command invoked inside another program, such as a test's runner)."""
    now = time.monotonic()
    if not AS_MAIN:
        return now
    try:  # /proc/self/stat's 22nd field: the process's start, in clock ticks since boot
        ticks = int(Path("/proc/self/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - min(max(age, 0.0), 3600.0)


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


def split_tail(cmd: list[str], script_options: set[str], ours: Collection[str]) -> tuple[list[str], dict[str, str]]:
    """Take proftune's own options (``ours``, each taking one value) off the end of a script's command
    line where the script has no such option (``-- python train.py --lr 0.1 --objective val_acc:max``):
    the command left, and each option taken with its value."""
    out: list[str] = []
    taken: dict[str, str] = {}
    i = 0
    head = 2 if len(cmd) > 1 and cmd[1] != "-m" else 3
    out.extend(cmd[:head])
    while i + head < len(cmd):
        tok = cmd[i + head]
        opt, eq, val = tok.partition("=")
        if opt not in ours or opt in script_options:
            out.append(tok)
            i += 1
            continue
        if not eq:
            if i + head + 1 >= len(cmd):
                raise ConfigError(f"{opt} needs a value (after the script, proftune's {opt} takes one).")
            val = cmd[i + head + 1]
            i += 1
        i += 1
        taken[opt] = val
    return out, taken


#: proftune's options a script's command line may end with.
TUNE_TAIL = ("--objective", "--trials", "--timeout", "--space", "--pruner", "--sampler")
OPTIMIZE_TAIL = ("--objective", "--budget", "--space", "--pruner")


def _script_parts(cmd: list[str], tail: Collection[str]) -> tuple[list[str], dict[str, str], ScriptFlags]:
    """The command without proftune's trailing options, those options, and the script's flags."""
    from ..script import read_flags

    flags = read_flags(cmd)
    options = {o for f in flags.flags for o in f.options}
    rest, taken = split_tail(cmd, options, tail)
    return rest, taken, flags


def tune_on_script(cmd: list[str], *, objective: list[str] | None, space: Path | None, trials: int,
                   timeout: float | None, sampler: str, pruner: str, study: str | None, db: str | None,
                   seed: int, max_failures: int) -> dict[str, Any]:
    """``proftune tune -- python train.py ARGS``: the search over the script's flags, as ``--json`` has it."""
    from ..exceptions import ProblemCollector
    from ..script import ScriptTask, script_space, tune_script
    from ..search import parse_objective

    rest, taken, flags = _script_parts(cmd, TUNE_TAIL)
    objectives = list(objective or []) or ([taken["--objective"]] if "--objective" in taken else [])
    if len(objectives) != 1:
        raise ConfigError("a script is tuned on one metric it prints or reports: --objective NAME[:max|min] "
                          f"(e.g. val_acc:max), but got {objectives or 'none'}.")
    problems = ProblemCollector()
    obj = parse_objective(objectives[0], problems, name="--objective")
    problems.raise_if_any()
    assert obj is not None
    task = ScriptTask(rest, metrics=[obj.metric], flags=flags)
    space_obj = script_space(task, taken.get("--space", space))
    result = tune_script(task, space_obj, obj, trials=int(taken.get("--trials", trials)),
                         timeout=float(taken["--timeout"]) if "--timeout" in taken else timeout,
                         sampler=taken.get("--sampler", sampler), pruner=taken.get("--pruner", pruner),
                         study=study, db=db, seed=seed, max_failures=max_failures)
    d = result.to_dict()
    best = result.selection.params if result.selection is not None else (result.best.params if result.best else None)
    d["script"] = {"command": task.flags_text({}), "metric_source": task.describe_source(),
                   "flags": [f.to_dict() for f in flags.flags], "space": space_obj.to_dict(),
                   "best_params": best, "best_command": task.flags_text(best) if best else None}
    return d


def optimize_on_script(cmd: list[str], *, objective: str | None, space: str | None, budget: str, seed: int,
                       db: str | None, study: str | None, started: float | None = None) -> dict[str, Any]:
    """``proftune optimize --budget 5m -- python train.py ARGS``: the loop on the script, within the
    budget counted from ``started`` (``time.monotonic()``; default: now): reading its flags (a run
    of the script up to its ``parse_args``: its imports) counts against it, and is done once."""
    from .._units import parse_duration
    from ..script import load_script, optimize_script

    started = time.monotonic() if started is None else started
    rest, taken, flags = _script_parts(cmd, OPTIMIZE_TAIL)
    task, space_obj, obj = load_script(rest, objective=taken.get("--objective", objective),
                                       space=taken.get("--space", space), flags=flags)
    text = taken.get("--budget", budget)
    budget_s = parse_duration(text, name="budget")
    return optimize_script(task, space_obj, obj, budget_s=float(budget_s), seed=seed, db=db, study=study,
                           pruner=taken.get("--pruner", "asha"), started=started,
                           progress=lambda text: err_console.print(text, markup=False, highlight=False))
