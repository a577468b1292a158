"""What every command shares: options, param parsing, error handling, JSON and progress output."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import traceback
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from ..exceptions import ConfigError, ProblemCollector, ProftuneError

T = TypeVar("T")

#: Human output and progress go to stderr; stdout carries only the result (and, with --json,
#: nothing but one JSON object).
err_console = Console(stderr=True)
out_console = Console()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout and nothing else there.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda or auto.")]
DbOpt = Annotated[
    str | None,
    typer.Option("--db", help="Run store URL (default $PROFTUNE_DB or sqlite:///proftune.db).", show_default=False),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of failures.")]
ParamOpt = Annotated[
    list[str] | None,
    typer.Option("--param", "-p", help="A param as key=value; repeat for several.", show_default=False),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed.")]
TaskArg = Annotated[str, typer.Argument(help="Task: file.py[:Class], pkg.mod:Class or a built-in name.")]
DataOpt = Annotated[
    str | None,
    typer.Option("--data", help="A LightningDataModule for a LightningModule TASK: file.py[:Class] or "
                 "pkg.mod:Class.", show_default=False),
]
EpochsOpt = Annotated[int | None, typer.Option("--epochs", min=1, help="Epochs to train.")]
MaxStepsOpt = Annotated[
    int | None, typer.Option("--max-steps", min=1, help="Stop after this many optimizer steps.")
]


def parse_value(text: str) -> Any:
    """``'64'`` -> 64, ``'1e-3'`` -> 0.001, ``'true'`` -> True, anything else stays a string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_params(items: list[str] | None) -> dict[str, Any]:
    """``["lr=0.01", "batch_size=64"]`` -> ``{"lr": 0.01, "batch_size": 64}``, validated."""
    from ..train import validate_params

    problems = ProblemCollector()
    params: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            problems.add(f"--param {item!r} is not key=value (e.g. --param lr=0.01).")
            continue
        params[key] = parse_value(value)
    problems.raise_if_any()
    return validate_params(params)


def to_jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "to_dict"):
        return to_jsonable(value.to_dict())
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if hasattr(value, "item"):
        with contextlib.suppress(Exception):
            return to_jsonable(value.item())
    return str(value)


def execute(
    fn: Callable[[], T],
    *,
    json_out: bool,
    debug: bool = False,
    render: Callable[[T], None] | None = None,
) -> None:
    """Run a command body: map errors to exit codes, print JSON or the rendered result.

    Exit 2 for a :class:`ConfigError` (bad usage, config or input), 1 for any other failure.
    With ``--json``, anything the body prints goes to stderr so stdout holds one JSON object.
    """
    try:
        if json_out:
            with contextlib.redirect_stdout(sys.stderr):
                result = fn()
        else:
            result = fn()
    except ConfigError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False, soft_wrap=True)
        if debug:
            err_console.print(traceback.format_exc(), markup=False, highlight=False)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        err_console.print("interrupted", markup=False)
        raise typer.Exit(130) from None
    except (ProftuneError, Exception) as exc:
        err_console.print(f"[bold red]failed:[/] {type(exc).__name__}: {exc}", markup=True,
                          highlight=False, soft_wrap=True)
        if debug:
            err_console.print(traceback.format_exc(), markup=False, highlight=False)
        else:
            err_console.print("(run again with --debug for the traceback)", style="dim")
        raise typer.Exit(1) from None
    if json_out:
        sys.stdout.write(json.dumps(to_jsonable(result)) + "\n")
        sys.stdout.flush()
    elif render is not None:
        render(result)
    else:
        out_console.print_json(json.dumps(to_jsonable(result)))


def progress_enabled() -> bool:
    """Progress bars only when stderr is a terminal."""
    return sys.stderr.isatty()


def task_arg(task: str, data: str | None) -> Any:
    """TASK as the library takes it: the spec, or (``--data``) the LightningModule on that datamodule."""
    if data is None:
        return task
    from ..integrations import task_with_data

    return task_with_data(task, data)
