"""Which command line names a script (``-- python train.py ARGS``), and what a command that takes no
script says when given one. Apart from ``_script.py`` so that the root group (``_common.py``) can
ask before any command parses."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["NOT_FOR_SCRIPTS", "is_script", "script_elsewhere"]


def is_script(task: str | None) -> bool:
    """TASK is a Python interpreter: what follows ``--`` is a script to run."""
    return task is not None and Path(task).name.startswith("python")


#: The commands that take a task but not a script, and why: each needs the model in proftune's process.
NOT_FOR_SCRIPTS = {
    "recommend": "its recommendations (batch size, the LR range test, noise scale, precision) step the model "
                 "inside proftune's process",
    "lr-find": "the LR range test steps the model inside proftune's process at a rising rate",
    "batch-size": "the batch-size search steps the model inside proftune's process at each size",
    "train": "it trains the task's model in proftune's fit loop",
    "compress": "compression needs the trained model inside proftune's process",
    "diagnose": "the health checks run inside proftune's fit loop",
    "profile": "it builds the task's model and steps it in proftune's process",
    "predict": "it traces the task's model in proftune's process",
    "bandit": "it trains the task's model in proftune's fit loop",
}


def script_elsewhere(command: str, args: Sequence[str]) -> str | None:
    """The message for ``proftune COMMAND -- python train.py ARGS`` where COMMAND takes no script (what
    to run instead), or None where ``args`` name no script or COMMAND takes one."""
    why = NOT_FOR_SCRIPTS.get(command)
    if why is None or not args:
        return None
    after = list(args[args.index("--") + 1:]) if "--" in args else list(args[:1])
    if not after or not is_script(after[0]):
        return None
    line = " ".join(after[:2]) + (" ARGS" if len(after) > 2 else "")
    return (f"`proftune {command}` takes a task, not a script: {why}, and a script keeps its own loop. "
            f"On a script: `proftune optimize -- {line} --objective val_acc:max` searches its flags (--lr, "
            f"--batch-size, ... as it has them) and keeps the best only where it beats the defaults beyond noise; "
            f"`proftune tune -- {line} --objective val_acc:max` runs the search alone; "
            f"`proftune run -- {line}` profiles it as it trains (step time, memory, gradient noise).")
