"""What every command shares: options, param parsing, error handling, JSON and progress output."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from .._cpplog import cpp_logs_shown
from .._jsonsafe import json_dumps
from .._paths import OutputPath, check_outputs
from .._threads import fixed_threads
from ..exceptions import ConfigError, ProblemCollector, ProftuneError, TaskWarning
from ..track import held_until_written
from ._options import ReportOpts, RunOpts, fill_choices

T = TypeVar("T")

#: Human output and progress go to stderr; stdout carries only the result (and, with --json,
#: nothing but one JSON object).
err_console = Console(stderr=True)
#: The width of a result printed where no terminal says it (piped, a file, a log): the tables
#: fit 100 columns, wrapping their long cells, rather than rich's 80 or a row as long as its text.
PIPED_WIDTH = 100
#: Human output and the result's tables; a terminal's own width, else $COLUMNS or PIPED_WIDTH.
out_console = Console(width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or PIPED_WIDTH))


def value_text(value: Any, *, digits: int = 4) -> str:
    """A value for a table cell, never a Python repr: ``0.003``, ``lr=0.003 batch_size=16``,
    ``0, 3`` (a list; a layer's name for a dict that has one), ``-`` for None."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, dict):
        return " ".join(f"{k}={_nested(v, digits)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v["layer"]) if isinstance(v, dict) and "layer" in v else _nested(v, digits)
                         for v in value) or "none"
    return str(value)


def _nested(value: Any, digits: int) -> str:
    text = value_text(value, digits=digits)
    return f"({text})" if isinstance(value, (dict, list, tuple)) and value else text


def keep_whole(table: Any, *columns: str) -> None:
    """Keep the cells of ``columns`` (numbers, short names) whole when a table is narrower than
    its text: their width is their widest cell, and the other columns wrap into what is left."""
    for column in table.columns:
        if column.header in columns:
            cells = [str(column.header), *(str(c) for c in column.cells)]
            column.min_width = max(len(c) for c in cells)
            column.no_wrap = True

def check_log(log: str | None, *, command: str) -> None:
    """``--log``'s value is known and its package installed: an error before the work, not after it."""
    if log is None:
        return
    if log != "wandb":
        raise ConfigError(f"--log {log!r} is unknown; valid: wandb (TensorBoard and MLflow: proftune export).")
    from .._optional import require

    require("wandb", feature=f"proftune {command} --log wandb")


def trial_logger(log: str | None, *, project: str) -> Any:
    """Where ``--log`` asks: the sink that logs each trial as it ends (``search(on_trial=)``), else None."""
    if log != "wandb":
        return None
    from ..report import WandbTrialLogger

    return WandbTrialLogger(project)


def log_run(log: str | None, run_id: int, *, project: str, db: str | None,
            live: Any = None) -> dict[str, Any] | None:
    """Log the finished run ``run_id`` and its children where ``--log`` asks, but for the trials
    ``live`` (a :func:`trial_logger`) logged as they ended; what was logged, the run first, each
    entry with ``live`` (logged while the run ran)."""
    if log != "wandb":
        return None
    from ..report import export_wandb

    ended = export_wandb(run_id, project=project, db=db, report=False, skip=live.run_ids if live else ())
    runs = [{**x, "live": False} for x in ended[:1]] + [{**x, "live": True} for x in (live.logged if live else [])]
    out = {"project": project, "runs": runs + [{**x, "live": False} for x in ended[1:]]}
    if live is not None and live.errors:  # W&B refused them live; the export above tried again
        out["live_errors"] = [{"proftune_run": run, "error": error} for run, error in live.errors]
    return out


def json_out(d: dict[str, Any], first: tuple[str, ...], logged: dict[str, Any] | None) -> dict[str, Any]:
    """A result's ``--json``: the keys its command's contract names ``first``, in that order, then the
    rest, with what W&B logged (``wandb``) where ``--log`` asked."""
    if logged is not None:
        d = {**d, "wandb": logged}
    return {**{k: d[k] for k in first}, **{k: v for k, v in d.items() if k not in first}}


def parse_value(text: str) -> bool | int | float | str | None:
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
    params: dict[str, bool | int | float | str | None] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or not value.strip():
            problems.add(f"--param {item!r} is not key=value (e.g. --param lr=0.01).")
            continue
        params[key] = parse_value(value)
    problems.raise_if_any()
    return validate_params(params)


#: Loggers of libraries whose warnings (deprecations, torch.compile notices) are noise to a user.
_LIBRARY_LOGGERS = ("torch", "torchao", "torch_pruning")


@contextlib.contextmanager
def library_warnings(*, shown: bool) -> Iterator[None]:
    """The one place the CLI hides library warnings (Python warnings and the libraries' logged
    warnings, the C++ lines proftune keeps off stderr); ``--debug`` shows them."""
    if shown:
        with cpp_logs_shown(), warnings.catch_warnings():
            _show_task_warnings()
            yield
        return
    loggers = [logging.getLogger(name) for name in _LIBRARY_LOGGERS]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _show_task_warnings()
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def _show_task_warnings() -> None:
    """Inside ``warnings.catch_warnings()``: a warning about the user's own task (a
    :class:`TaskWarning`, which warns once itself) printed as one line, ``warning: ...``."""
    warnings.filterwarnings("always", category=TaskWarning)
    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, TaskWarning):
            err_console.print(f"[bold yellow]warning:[/] {escape(str(message))}", highlight=False)
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM handled like Ctrl-C while a command runs: a KeyboardInterrupt in the main thread,
    so the run is recorded ``interrupted`` and every ``finally`` (temp folders) runs.

    Only the first SIGTERM interrupts: a repeat (a service manager or a shell sending it again)
    would cut the cleanup the first one started, leaving the run ``running`` and its temp
    folders behind; SIGKILL remains for a cleanup that hangs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def interrupt(signum: int, frame: object) -> None:
        nonlocal raised
        if raised:
            return
        raised = True
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt_handled() -> None:
    """Tell CPython that the KeyboardInterrupt was handled, so that the process exits 130.

    A KeyboardInterrupt that leaves code run from a string (``exec(str)``: a dataclass or a
    namedtuple being made, as a lazy import does in a training step) sets CPython's "unhandled
    KeyboardInterrupt" flag, even when a caller catches it; ``python -m proftune`` then ends by
    killing itself with SIGINT (exit -2) instead of the exit code we give. The interpreter clears
    that flag as it starts to run any code from a string, and this is such a run.
    """
    exec("")  # an empty program: its only effect is the reset above


def _error_line(exc: BaseException) -> str:
    """``Type: message`` of a failure, in flags, escaped for rich. A database driver's error (the
    store's, Optuna's storage) is its driver's reason alone: SQLAlchemy appends the SQL statement
    and its parameters, which no user should have to read."""
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.StatementError) and exc.orig is not None:
        reason = f"{type(exc.orig).__name__}: {exc.orig}"
        return f"the database failed: {escape(as_flags(reason))}"
    return f"{type(exc).__name__}: {escape(as_flags(str(exc)))}"


def _this_command(text: str) -> str:
    """``proftune COMMAND`` in a message named as the command that runs (``proftune optimize``)."""
    if "proftune COMMAND" not in text:
        return text
    ctx = _click_context()
    name = ctx.info_name if ctx is not None and ctx.info_name in ("tune", "optimize") else "optimize"
    return text.replace("proftune COMMAND", f"proftune {name}")


def execute(
    fn: Callable[[], T],
    *,
    json_out: bool,
    debug: bool = False,
    render: Callable[[T], None] | None = None,
    threads: int | None = None,
) -> None:
    """Run a command body: map errors to exit codes, print JSON or the rendered result.

    ``threads`` (``--threads N``) fixes the CPU thread count of every fit the body runs, in this
    process and the workers it starts; None leaves it to be computed.

    Exit 2 for a :class:`ConfigError` (bad usage, config or input), 1 for any other failure.
    With ``--json``, anything the body prints goes to stderr so stdout holds one JSON object.
    """
    try:
        with library_warnings(shown=debug), fixed_threads(threads), _sigterm_as_interrupt():
            if json_out:
                with contextlib.redirect_stdout(sys.stderr):
                    result = fn()
            else:
                result = fn()
    except ConfigError as exc:
        err_console.print(f"[bold red]error:[/] {escape(as_flags(_this_command(str(exc))))}",
                          markup=True, highlight=False, soft_wrap=True)
        if debug:
            err_console.print(traceback.format_exc(), markup=False, highlight=False)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        _interrupt_handled()
        err_console.print("interrupted", markup=False)
        raise typer.Exit(130) from None
    except (ProftuneError, Exception) as exc:  # noqa: BLE001 - the CLI boundary: any failure is exit 1 with its message
        from .._usercode import failed_in

        where = failed_in(exc)  # the user's own line to fix (a task method), shown without --debug
        err_console.print(f"[bold red]failed:[/] {_error_line(exc)}", markup=True, highlight=False, soft_wrap=True)
        if where is not None and where not in str(exc):
            err_console.print(f"  {where}", markup=False, highlight=False, soft_wrap=True)
        if debug:
            err_console.print(traceback.format_exc(), markup=False, highlight=False)
        else:
            err_console.print("(run again with --debug for the traceback)", style="dim")
        raise typer.Exit(1) from None
    if json_out:
        sys.stdout.write(json_dumps(result) + "\n")
        sys.stdout.flush()
    elif render is not None:
        render(result)
    else:
        out_console.print_json(json_dumps(result))


def execute_run(body: Callable[[], T], o: RunOpts, r: ReportOpts, *, render: Callable[[T], None] | None = None,
                threads: int | None = None,
                outputs: Sequence[OutputPath] | Callable[[], Sequence[OutputPath]] = (),
                written: Sequence[str | Path | None] = ()) -> None:
    """:func:`execute` of a command that runs a task: ``body`` after its outputs' checks, then
    ``--report``'s page (:func:`with_report`), with the command's :class:`RunOpts` and :class:`ReportOpts`."""
    execute(with_report(body, r.report, o.db, force=r.force, outputs=outputs, written=written), json_out=o.json_out,
            debug=o.debug, render=render, threads=threads)


def with_report(body: Callable[[], T], report: str | None, db: str | None, *, force: bool = False,
                outputs: Sequence[OutputPath] | Callable[[], Sequence[OutputPath]] = (),
                written: Sequence[str | Path | None] = ()) -> Callable[[], T]:
    """``body`` once every output path (``outputs`` and ``--report``) has passed its check (exit 2
    before any work: a missing or unwritable folder, an existing file without ``--force``), then
    (with ``--report FILE``) the HTML report of the run it recorded. ``outputs`` may be a function
    (called inside the command, so that a missing optional dependency is an exit 2 too);
    ``written``: the paths the library checks and writes itself (what was kept if a write fails).
    The run is finished once all are written (``track.held_until_written``)."""

    # at the start: a task that changes the working folder (as Hydra does) must not move it
    report = os.path.abspath(report) if report else report

    def run() -> T:
        given = outputs() if callable(outputs) else outputs
        check_outputs([*given, OutputPath("--report", report)], force=force)
        # the command's Run is finished only once its outputs are written: a failed write leaves
        # it failed, naming the file, its device's free space and what was kept
        with held_until_written([*(o.path for o in given), *written, report]):
            result = body()
            if report is not None:
                from ..report import write_report

                path = write_report(result, report, db=db, force=True)  # checked above
                err_console.print(f"report: {path}", markup=False, highlight=False)
        return result

    return run


#: Library argument names whose option has another Python name in the command (``plot_dir=`` is
#: compress's ``--plot``); an option whose Python name ends in ``_`` (``compile_``) needs no entry.
LIBRARY_ARGUMENTS = {
    "plot_dir": "plot",
    # search() (tune): SearchConfig's plural fields (its --objective is repeated) and RayOptions(address=)
    "address": "ray_address",
    "constraints": "constraint",
    "objectives": "objective",
    "params": "param",
    "methods": "method",  # compress(methods=...): its --method is repeated
    "uri": "mlflow",  # report.export_mlflow(run, uri): export's --mlflow
    # recommend(): its time budgets in seconds (the command takes a duration, 300 or 5min)
    "embedding_budget_s": "embedding_budget",
    "optimizer_budget_s": "optimizer_budget",
}


def as_flags(message: str) -> str:
    """A library message in the words of the command line, the one place that translates:
    ``max_failures=3`` (a Python argument of the running command) reads ``--max-failures 3``,
    ``distill=True`` of a switch reads ``--distill``, a sequence ``ignore_layers=('0', '3')``
    reads ``--ignore-layers 0,3`` and ``ignore_layers=`` alone (the argument, no value) reads
    ``--ignore-layers``. The library names its Python arguments; the flags are the CLI's business."""
    import ast
    import re

    ctx = _click_context()
    params = getattr(getattr(ctx, "command", None), "params", None) or []
    options = {p.name: p for p in params
               if getattr(p, "param_type_name", "") == "option" and p.name and p.opts[0].startswith("--")}
    options |= {name.rstrip("_"): p for name, p in options.items()}
    options |= {lib: options[cli] for lib, cli in LIBRARY_ARGUMENTS.items() if cli in options}
    if not options:
        return message
    names = "|".join(re.escape(n) for n in sorted(options, key=len, reverse=True))

    def flag(m: re.Match[str]) -> str:
        option, value = options[m.group(1)], m.group(2)
        if value == "True" and getattr(option, "is_flag", False):
            return str(option.opts[0])
        if value.startswith(("(", "[", "{")):
            try:
                items = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                items = None
            if isinstance(items, dict):  # params={'k': 3, 'j': 'x'} -> --param k=3 --param j=x
                return " ".join(f"{option.opts[0]} {k}={_cli_value(v)}" for k, v in items.items())
            if isinstance(items, (tuple, list)):
                value = _cli_value(items)
        if value:
            return f"{option.opts[0]} {value}"
        rest = m.string[m.end():m.end() + 1]  # name=3 -> --name 3; a bare name= -> --name
        return str(option.opts[0]) + ("" if rest in ("", " ", ".", ",", ";", ":", ")") else " ")

    return re.sub(rf"(?<![\w.-])({names})=(True\b|\([^()]*\)|\[[^\[\]]*\]|\{{[^{{}}]*\}}|)", flag, message)


def _cli_value(value: Any) -> str:
    """A value as ``key=value`` takes it on the command line: ``(3, 32, 32)`` reads ``3,32,32``."""
    return ",".join(str(v) for v in value) if isinstance(value, (tuple, list)) else str(value)


def _click_context() -> Any:
    """The running command's click context (typer vendors click as typer._click since 0.2x)."""
    import importlib

    for module in ("typer._click.globals", "click"):
        try:
            ctx = importlib.import_module(module).get_current_context(silent=True)
        except ImportError:
            continue
        if ctx is not None:
            return ctx
    return None


def progress_enabled() -> bool:
    """Progress bars only when stderr is a terminal."""
    return sys.stderr.isatty()


def task_arg(task: str, data: str | None) -> Any:
    """TASK as the library takes it: the spec, or (``--data``) the LightningModule on that datamodule."""
    if data is None:
        return task
    from ..integrations import task_with_data

    return task_with_data(task, data)


# -- --help as people read it ------------------------------------------------------------------------
#: The value a flag takes in --help, by Python type (typer prints ``<str>``, ``<bool>``).
_METAVARS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "bool": "BOOLEAN"}


def _tidy_param(param: Any) -> None:
    """A flag without a value (``--resume``) shows none; an option its value's kind (``TEXT``);
    an argument its name in capitals (``TASK``), never typer's ``<bool>`` / ``{task}``."""
    if getattr(param, "metavar", None) is not None:
        return
    if isinstance(param, TyperOption):
        if param.is_flag or param.count:
            param.metavar = ""
            return
        text = param.display_type(None).strip("<>")  # type: ignore[arg-type]
        repeated = text.startswith("list[")
        kind = text[5:-1] if repeated else text
        param.metavar = kind.upper() if "|" in kind else _METAVARS.get(kind, kind.upper())
    elif isinstance(param, TyperArgument):
        param.metavar = (param.name or "arg").upper()


def _one_line_paragraphs(text: str | None) -> str | None:
    """Docstring paragraphs with their line breaks joined (rich keeps them, and wraps again)."""
    if not text:
        return text
    import inspect

    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(text).split("\n\n"))


def tidy_help(cmd: Any) -> None:
    """Make ``cmd`` (a typer command or group, with its subcommands) print a plain --help."""
    for param in cmd.params:
        _tidy_param(param)
    cmd.help = _one_line_paragraphs(cmd.help)
    if type(cmd) is TyperCommand:
        cmd.__class__ = _Command
    elif type(cmd) is TyperGroup:
        cmd.__class__ = _Group
    for sub in (getattr(cmd, "commands", None) or {}).values():
        if isinstance(sub, (TyperCommand, TyperGroup)):
            tidy_help(sub)


def _plain_help_option(opt: Any) -> Any:
    """--help shows no value (typer prints ``--help <bool>``)."""
    if opt is not None:
        opt.metavar = ""
    return opt


class _Command(TyperCommand):
    """A typer command whose usage line names its arguments plainly: ``TASK``, ``[OUT]``, and
    whose options' help lists the registered choices as they are when --help is shown."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        for p in self.params:
            template = getattr(p, "help_template", None) or getattr(p, "help", None)
            if template and "@@" in template:
                setattr(p, "help_template", template)  # noqa: B010 - click's Parameter has no such field
                setattr(p, "help", fill_choices(template))  # noqa: B010
        super().format_help(ctx, formatter)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name == "argument":
                name = str(p.metavar or (p.name or "arg").upper())
                name = name if p.required else f"[{name}]"
                pieces.append(name + ("..." if p.nargs != 1 else ""))
        return pieces

    def get_help_option(self, ctx: Any) -> Any:
        return _plain_help_option(super().get_help_option(ctx))


class _Group(TyperGroup):
    """A typer group whose --help is plain too."""

    def get_help_option(self, ctx: Any) -> Any:
        return _plain_help_option(super().get_help_option(ctx))


class HelpGroup(_Group):
    """The root group (``typer.Typer(cls=HelpGroup)``): tidies every command's --help once, when
    the CLI is built."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        tidy_help(self)

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """A script after a command that takes none (``recommend -- python train.py``): exit 2 saying
        what to run on a script instead, before the command's own parse calls it an extra argument."""
        import importlib

        from ._script_args import script_elsewhere

        name, cmd, rest = super().resolve_command(ctx, args)
        message = script_elsewhere(name or "", rest)
        if message is not None:  # the click that typer runs on: its vendored copy since 0.2x
            package = type(ctx).__module__.rsplit(".", 1)[0]
            raise importlib.import_module(f"{package}.exceptions").UsageError(message, ctx)
        return name, cmd, rest
