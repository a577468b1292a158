"""The ``proftune`` command line: one thin module per command over the Python API."""

from __future__ import annotations

import contextlib

import typer

from ._bandit import bandit
from ._batch_size import batch_size
from ._common import HelpGroup
from ._compress import compress
from ._diagnose import diagnose
from ._export import export_command
from ._lr_find import lr_find_command
from ._optimize import optimize_command
from ._predict import predict_command
from ._profile import profile_command
from ._recommend import recommend_command
from ._report import report_command
from ._run import run_command
from ._runs import runs_app
from ._tasks import tasks
from ._train import train
from ._tune import tune

__all__ = ["app", "main"]

app = typer.Typer(
    name="proftune",
    help="Compute the parameters of PyTorch models and their training from measurements.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=HelpGroup,
)
#: a script's command line after -- (python train.py ARGS) reaches the command whole
_SCRIPT_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}
app.command("optimize", context_settings=_SCRIPT_ARGS)(optimize_command)  # the main job first in --help
app.command("tasks")(tasks)
app.command("train")(train)
app.add_typer(runs_app, name="runs")

# Commands of later subpackages register here, one line each.
app.command("compress")(compress)
app.command("recommend")(recommend_command)
app.command("batch-size")(batch_size)
app.command("lr-find")(lr_find_command)
app.command("diagnose")(diagnose)
app.command("bandit")(bandit)
app.command("tune", context_settings=_SCRIPT_ARGS)(tune)
app.command("profile")(profile_command)
app.command("report")(report_command)
app.command("export")(export_command)
app.command("predict")(predict_command)
app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run_command)


#: The exit code of a command stopped by Ctrl-C or SIGTERM (``_common.execute``).
INTERRUPTED_EXIT = 130


def main() -> None:
    """Entry point of the console script. A command stopped by a signal ends at once: its atexit
    handlers run (temporary folders, multiprocessing's children, logging) and its streams are
    flushed, but not the interpreter's teardown, which unloads torch's libraries: 1.1-1.5 s for
    ``import torch`` alone and 2.1 s for the CLI's imports on a loaded 2-core machine (measured),
    most of the 5 s a stopped ``tune --workers 2`` has to exit in (issue 47)."""
    from . import _script

    _script.AS_MAIN = True  # this process is the command: its start starts a script's budget clock
    try:
        app(prog_name="proftune")
    except SystemExit as exc:
        if exc.code == INTERRUPTED_EXIT:
            _exit_now(INTERRUPTED_EXIT)
        raise


def _exit_now(code: int) -> None:
    import atexit
    import os
    import sys

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
