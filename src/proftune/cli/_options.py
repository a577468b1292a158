"""Every option and argument the commands share, declared once as a typed ``Annotated`` alias.

A command module names them in its signature (``task: TaskArg``, ``db: DbOpt = None``); its own
options stay in its file. A flag that several commands take in uses of their own is declared with
:func:`shared`: one help text (:data:`SHARED_HELP`), each command adding only what differs. The
options nearly every command takes together are one group, :class:`RunOpts` (``o: RunOpts = RUN``),
which :func:`command` spreads into the signature typer reads, in its place, and gathers back into
one record for the command. An option whose valid values come from a registry lists them in its
help through :func:`choices`, filled when --help is shown, so an installed plug-in's names are there.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar, cast

import typer

from ..exceptions import ProftuneError

#: The registries whose names an option's --help lists (``choices("samplers")`` in its help text),
#: read when the help is shown, so an installed plug-in's names are among them.
CHOICES: dict[str, Callable[[], Sequence[str]]] = {
    "samplers": lambda: _registry("search", "SAMPLER_REGISTRY").names(),
    "pruners": lambda: _registry("search", "PRUNER_REGISTRY").names(),
    "search_backends": lambda: _registry("search", "SEARCH_BACKEND_REGISTRY").names(),
    "quant_libraries": lambda: tuple(dict.fromkeys(
        k.split(":")[0] for k in _registry("compress", "QUANT_BACKEND_REGISTRY").names())),
    "compilers": lambda: _registry("compress", "COMPILER_REGISTRY").names(),
    "compress_methods": lambda: _registry("compress", "COMPRESS_METHODS").names(),
    "run_kinds": lambda: _registry("track", "RUN_KIND_REGISTRY").names(),
    "metrics": lambda: _registry("metrics", "METRICS").names(),
    "task_metrics": lambda: _registry("metrics", "metric_names")(stage="evaluate"),
    "optimize_stages": lambda: tuple(_registry("optimize", "OPTIMIZE_STAGES")),
}


def _registry(package: str, name: str) -> Any:
    import importlib

    return getattr(importlib.import_module(f"proftune.{package}"), name)


def choices(kind: str, *, last: str = " or ") -> str:
    """A mark in an option's help text that --help replaces with the names of ``kind`` registered
    then (built-ins and plug-ins): ``a, b or c`` (``last=", "``: ``a, b, c``)."""
    if kind not in CHOICES:
        raise ValueError(f"kind={kind!r} is unknown; valid: {', '.join(CHOICES)}.")
    return f"@@{kind}|{last}@@"


def fill_choices(text: str) -> str:
    """``text`` with each :func:`choices` mark replaced by the names registered now."""
    import re

    def names(m: re.Match[str]) -> str:
        try:
            found = list(CHOICES[m[1]]())
        except ProftuneError as e:  # a broken plug-in: said here, the command itself then refuses it
            return f"(the registered names could not be read: {e})"
        return ", ".join(found[:-1]) + m[2] + found[-1] if len(found) > 1 else "".join(found) or "none registered"

    return re.sub(r"@@(\w+)\|(.*?)@@", names, text)


#: The one help text of each --flag that several commands take. A command declares the flag through
#: :func:`shared`, adding after it only what differs in its use (``then``): the shared part cannot drift.
SHARED_HELP: dict[str, str] = {
    "--batch-size": "Batch size",
    "--constraint": 'Hard constraint on every trial, e.g. "step_time_ms<50"; repeat for several; METRIC: '
                    f"{choices('metrics', last=', ')} or one the task reports",
    "--ddp": "Profile N DDP ranks on this machine (gloo; NCCL on GPUs)",
    "--epochs": "Epochs to train",
    "--force": "Replace existing output files (a symbolic link is replaced itself, never followed); without it "
               "they are refused before any work",
    "--goal": "What compression minimises",
    "--max-accuracy-drop": "Largest metric drop compression may cost (0.01 = 1 point)",
    "--memory-budget": "Largest training step memory: 4GiB, 512MB or bytes (123456)",
    "--metric": f"A task metric ({choices('task_metrics', last=', ')} or one the task reports)",
    "--objective": "METRIC[:max|min] (default accuracy:max, else val_loss:min); METRIC: "
                   f"{choices('metrics', last=', ')} or one the task reports",
    "--out": "Where to write",
    "--plot": "Write PNG plots here",
    "--report": "Also write the result as one self-contained HTML report here",
    "--space": "Search space YAML (params, fixed, forbid, tiers); for a script (-- python train.py ARGS) it "
               "narrows or extends the space read from its flags",
    "--steps": "Training steps to measure",
    "--study": "Study name",
    "--target": "The target device",
}


def shared(flag: str, *aliases: str, then: str = ".", **kw: Any) -> Any:
    """``typer.Option(flag)`` with the flag's one help text (:data:`SHARED_HELP`) and, after it, what
    this command adds (``then``: ``" per trial (default: the task's)."``); ``kw`` as typer takes them."""
    if flag not in SHARED_HELP:
        raise ValueError(f"flag={flag!r} has no shared help; valid: {', '.join(SHARED_HELP)}.")
    return typer.Option(flag, *aliases, help=SHARED_HELP[flag] + then, **kw)


def shared_output(flag: str, *, then: str = ".") -> Any:
    """A shared output path option (:func:`shared`): no default shown, resolved when the command
    starts (:func:`at_start`)."""
    return shared(flag, then=then, show_default=False, callback=at_start)


BatchSizeOpt = Annotated[int | None, shared("--batch-size", then=" (default: the task's).", show_default=False)]
ConstraintOpt = Annotated[list[str] | None, shared("--constraint", show_default=False)]
MaxDropOpt = Annotated[float, shared("--max-accuracy-drop")]
StudyOpt = Annotated[str | None, shared("--study", then="; the same name again continues it.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout and nothing else there.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda or auto.")]


def _db_at_start(url: str | None) -> str:
    """``--db`` (or its default) resolved when the command starts, not when the store is opened:
    a task that changes the working folder (as Hydra does) must not move a relative SQLite file."""
    from ..track import resolve_db_url

    return resolve_db_url(url)


DbOpt = Annotated[
    str | None,
    typer.Option("--db", help="Run store URL or a .db file (default $PROFTUNE_DB or sqlite:///proftune.db).",
                 show_default=False, callback=_db_at_start),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of failures and library warnings.")]
ParamOpt = Annotated[
    list[str] | None,
    typer.Option("--param", "-p", help="A param as key=value; repeat for several.", show_default=False),
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed.")]
ThreadsOpt = Annotated[
    int | None,
    typer.Option("--threads", min=1, help="CPU threads of every training (default: computed from the measured "
                 "step times, re-checked when the machine's load changes).", show_default=False),
]
_TASK_HELP = "Task: file.py[:Class], pkg.mod:Class, timm:MODEL or a built-in name."
TaskArg = Annotated[str, typer.Argument(help=_TASK_HELP)]


def at_start(path: Any) -> Any:
    """An output path resolved when the command starts (as given: None, or an empty one its check
    names): a task that changes the working folder (as Hydra does) must not move what it writes."""
    if path is None or not str(path).strip():
        return path
    return type(path)(os.path.abspath(path))


def unset(*flags: str, help: str, **kw: Any) -> Any:
    """A ``typer.Option`` whose value is None until given, so --help shows no default:
    ``out: Annotated[Path | None, unset("--out", help="...")] = None``."""
    return typer.Option(*flags, help=help, show_default=False, **kw)


def output(*flags: str, help: str, **kw: Any) -> Any:
    """An output path option (:func:`unset`), resolved when the command starts (:func:`at_start`)."""
    return unset(*flags, help=help, callback=at_start, **kw)


def unset_argument(*, help: str) -> Any:
    """A ``typer.Argument`` that may be left out (None), with no default shown."""
    return typer.Argument(help=help, show_default=False)


#: TASK where a command can do without one (``profile --compare``).
OptionalTaskArg = Annotated[str | None, unset_argument(help=_TASK_HELP)]
DataOpt = Annotated[
    str | None,
    typer.Option("--data", help="A LightningDataModule for a LightningModule TASK: file.py[:Class] or "
                 "pkg.mod:Class.", show_default=False),
]
EpochsOpt = Annotated[int | None, shared("--epochs", min=1)]
MaxStepsOpt = Annotated[
    int | None, typer.Option("--max-steps", min=1, help="Stop after this many optimizer steps.")
]
LogOpt = Annotated[
    str | None,
    typer.Option("--log", help="wandb: log to Weights & Biases as one group: each trial as it ends, "
                 "while the study runs; the run and the other runs it started when it ends "
                 "(offline: WANDB_MODE=offline).", show_default=False),
]
WandbProjectOpt = Annotated[str, typer.Option("--wandb-project", help="W&B project for --log wandb.")]


ReportOpt = Annotated[str | None, shared_output("--report")]
ForceOpt = Annotated[bool, shared("--force")]


@dataclasses.dataclass(frozen=True)
class StoreOpts:
    """The options of every command that reads or writes the store: ``--db --json --debug``.
    The groups below add their own to these (in --help, a group's own options come first)."""

    db: DbOpt = None
    json_out: JsonOpt = False
    debug: DebugOpt = False


@dataclasses.dataclass(frozen=True)
class RunOpts(StoreOpts):
    """The options of every command that runs a task: ``--seed --device --db --json --debug``."""

    seed: SeedOpt = 0
    device: DeviceOpt = "auto"


@dataclasses.dataclass(frozen=True)
class FitOpts:
    """The options of a command that trains TASK: ``--data --epochs --max-steps --param``."""

    data: DataOpt = None
    epochs: EpochsOpt = None
    max_steps: MaxStepsOpt = None
    param: ParamOpt = None


#: The defaults of a command's ``t: FitOpts`` parameter.
FIT = FitOpts()


@dataclasses.dataclass(frozen=True)
class ReportOpts:
    """The options of every command that records a run: ``--report FILE`` and ``--force``."""

    report: ReportOpt = None
    force: ForceOpt = False


@dataclasses.dataclass(frozen=True)
class FileOpts(StoreOpts):
    """The options of a command that reads the store and writes files: ``--force --db --json --debug``."""

    force: ForceOpt = False


#: The defaults of a command's ``f: FileOpts`` parameter.
FILE = FileOpts()
#: The defaults of a command's ``r: ReportOpts`` parameter.
REPORT = ReportOpts()
#: The default of a command's ``o: RunOpts`` parameter (typer fills each field from its option).
RUN = RunOpts()

F = TypeVar("F", bound=Callable[..., Any])


def command(fn: F) -> F:
    """``fn`` as typer reads it: each parameter annotated with an option group (a dataclass of
    ``Annotated`` options) is spread into those options in its place, and gathered back into one
    record of the group when typer calls it."""
    hints = typing.get_type_hints(fn, include_extras=True)
    groups: dict[str, tuple[type, tuple[str, ...]]] = {}
    params: list[inspect.Parameter] = []
    for p in inspect.signature(fn).parameters.values():
        kind = hints.get(p.name)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            own = set(vars(kind).get("__annotations__", {}))  # the group's own options first, as declared
            fields = sorted(dataclasses.fields(kind), key=lambda f: f.name not in own)
            field_hints = typing.get_type_hints(kind, include_extras=True)
            groups[p.name] = (kind, tuple(f.name for f in fields))
            params += [inspect.Parameter(f.name, p.kind, default=f.default, annotation=field_hints[f.name])
                       for f in fields]
        else:
            params.append(p.replace(annotation=hints.get(p.name, p.annotation)))

    @functools.wraps(fn)
    def spread(**kwargs: Any) -> Any:
        for name, (kind, fields) in groups.items():
            kwargs[name] = kind(**{f: kwargs.pop(f) for f in fields})
        return fn(**kwargs)

    spread.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    spread.__annotations__ = {p.name: p.annotation for p in params}
    return cast(F, spread)
