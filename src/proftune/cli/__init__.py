"""The ``proftune`` command line: one thin module per command over the Python API."""

from __future__ import annotations

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

app = typer.Typer(
    name="proftune",
    help="Compute the parameters of PyTorch models and their training from measurements.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=HelpGroup,
)
app.command("optimize")(optimize_command)  # the main job first in --help
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
app.command("tune")(tune)
app.command("profile")(profile_command)
app.command("report")(report_command)
app.command("export")(export_command)
app.command("predict")(predict_command)
app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run_command)


def main() -> None:
    """Entry point of the console script."""
    app(prog_name="proftune")


if __name__ == "__main__":  # pragma: no cover
    main()
