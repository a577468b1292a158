"""A training script as it is: ``proftune tune/optimize -- python train.py ARGS``.

- :func:`read_flags`: its parameters, read from its argparse parser in a child process that
  stops at ``parse_args`` (its training never runs).
- :class:`ScriptTask`: the script as a task: each evaluation one process of it with the flags
  set, its metric read from ``proftune.report(...)`` calls or ``name=value`` lines on stdout, the
  profile from the hooks of ``proftune run``; :func:`script_space`: its search space.
- :func:`optimize_script`: the loop for a script: its defaults, the search, the race of the best
  against the defaults (paired ``--seed`` where it has one), the flags to pass.
- :func:`report`: what a script calls to report a metric (``proftune.report(val_acc=0.9, step=3)``).
"""

from __future__ import annotations

from ._channel import REPORT_ENV, report
from ._flags import Flag, ScriptFlags, read_flags
from ._loop import SKIPPED_STAGES, load_script, optimize_script, tune_script
from ._process import ScriptRun, metric_lines, run_process
from ._script_space import script_space
from ._task import ScriptCut, ScriptFailed, ScriptTask, imports_torch

__all__ = [
    "REPORT_ENV",
    "SKIPPED_STAGES",
    "Flag",
    "ScriptCut",
    "ScriptFailed",
    "ScriptFlags",
    "ScriptRun",
    "ScriptTask",
    "imports_torch",
    "load_script",
    "metric_lines",
    "optimize_script",
    "read_flags",
    "report",
    "run_process",
    "script_space",
    "tune_script",
]
