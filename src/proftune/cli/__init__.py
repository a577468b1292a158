"""The ``proftune`` command line: one thin module per command over the Python API."""

from __future__ import annotations

import sys

import typer

from ._compress import compress
from ._runs import runs_app
from ._tasks import tasks
from ._train import train

app = typer.Typer(
    name="proftune",
    help="Compute the parameters of PyTorch models and their training from measurements.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("tasks")(tasks)
app.command("train")(train)
app.add_typer(runs_app, name="runs")

# Commands of later subpackages register here, one line each.
app.command("compress")(compress)


def main() -> None:
    """Entry point of the console script."""
    app(prog_name="proftune")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
