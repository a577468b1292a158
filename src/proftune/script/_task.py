"""A training script as it is, searched as a task: its flags are the params, its metric what it
reports or prints, each evaluation one process of it."""

from __future__ import annotations

import ast
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..exceptions import ConfigError, ProftuneError
from ..profile import parse_command
from ..search import ObjectiveTask
from ._flags import ScriptFlags, read_flags
from ._probe import Value
from ._process import GRACE_S, ScriptRun, run_process

__all__ = ["ScriptCut", "ScriptFailed", "ScriptTask", "imports_torch"]

#: Flag names a search leaves as the script has them: its protocol, seeds, where it runs.
PROTOCOL_FLAGS = ("seed", "epochs", "num_epochs", "max_epochs", "n_epochs", "steps", "max_steps",
                  "num_workers", "workers", "log_interval", "log_every", "print_every", "eval_every",
                  "save_every", "patience", "device", "gpus", "gpu", "cuda", "no_cuda")


class ScriptFailed(ProftuneError):
    """A run of the script ended with a non-zero exit, or without the metric: a failed trial."""


class ScriptCut(ScriptFailed):
    """A run of the script cut at its task's ``deadline`` (a budget's end), or not started past it."""


def imports_torch(path: str | Path) -> bool:
    """Whether the script's own source imports torch (or Lightning, transformers): what the hooks of
    ``proftune run`` can watch. A script that cannot be parsed here: False."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    roots = ("torch", "lightning", "pytorch_lightning", "transformers")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in roots for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in roots:
            return True
    return False


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) and v != 0 and (abs(v) < 1e-4 or abs(v) >= 1e6) else f"{v:.6g}"
    return str(v)


class ScriptTask(ObjectiveTask):
    """``python train.py ARGS`` as a task: ``call(params, seed)`` runs it once with the flags set.

    ``objectives``: the metric names it must report (the first is watched for pruning). ``flags``:
    its argparse flags (read without running it when not given). ``profile``: run each trial under
    ``proftune run``'s hooks (default: where the script imports torch)."""

    reports_progress = True

    def __init__(self, command: Sequence[str], *, metrics: Sequence[str], flags: ScriptFlags | None = None,
                 profile: bool | None = None, grace_s: float = GRACE_S) -> None:
        kind, target, argv = parse_command(command)
        self.kind, self.target = kind, target
        self.argv = list(argv)  # the script (or -m module) and the user's own ARGS
        if kind == "module":
            self.argv = ["-m", *argv]
        self.flags = flags if flags is not None else read_flags(command)
        self.name = Path(target).stem if kind == "path" else target  # type: ignore[misc]
        self.metrics = list(dict.fromkeys(metrics))
        if not self.metrics:
            raise ConfigError("a script's metric must be named with objective= (NAME[:max|min]: what it prints as "
                              "`NAME=value` or reports with proftune.report(NAME=value)).")
        given = self.given_args()
        self.default_params = {**self.flags.defaults, **given}  # type: ignore[misc]
        self.takes_seed = "seed" in self.flags and self.flags["seed"].settable
        self.profile = imports_torch(target) if (profile is None and kind == "path") else bool(profile)
        self.grace_s = grace_s
        #: Seconds one run may take before it is ended (SIGTERM, then SIGKILL): a failed run. None: no limit.
        self.timeout_s: float | None = None
        #: ``time.monotonic()`` at which a run still going is cut and after which none starts
        #: (:class:`ScriptCut`): the end of a budget. None: none.
        self.deadline: float | None = None
        self._window: float | None = None  # cut_after's seconds, and the end they set at the next run
        self._window_end: float | None = None
        self.fn = self.call  # the search calls ``call``; ``fn`` only names it
        #: The runs of the script so far, the last one last.
        self.runs: list[ScriptRun] = []

    # -- the command line -----------------------------------------------------------------------
    def given_args(self) -> dict[str, Value]:
        """The flags the user's ARGS set, by dest, as the script's parser would read them (typed)."""
        out: dict[str, Value] = {}
        args = self.argv[2:] if self.kind == "module" else self.argv[1:]
        for f in self.flags.flags:
            if not f.settable:
                continue
            for i, a in enumerate(args):
                opt, eq, val = a.partition("=")
                if opt not in f.options:
                    continue
                if f.type == "bool":
                    out[f.dest] = not bool(f.default)
                elif eq:
                    out[f.dest] = self._typed(f.dest, val)
                elif i + 1 < len(args):
                    out[f.dest] = self._typed(f.dest, args[i + 1])
        return out

    def _typed(self, dest: str, text: str) -> int | float | str:
        kind = self.flags[dest].type
        try:
            return int(text) if kind == "int" else float(text) if kind == "float" else text
        except ValueError:
            return text

    def command_for(self, params: Mapping[str, Any]) -> list[str]:
        """The script's argv with each param's flag set (the user's own value of it replaced)."""
        argv = list(self.argv)
        head, args = (argv[:2], argv[2:]) if self.kind == "module" else (argv[:1], argv[1:])
        out_args: list[str] = []
        set_flags = [self.flags[k] for k in params if k in self.flags and self.flags[k].settable]
        drop = {o for f in set_flags for o in f.options}
        i = 0
        while i < len(args):
            opt, eq, _ = args[i].partition("=")
            if opt in drop:
                f = next(f for f in set_flags if opt in f.options)
                i += 1 if (eq or f.type == "bool") else 2
                continue
            out_args.append(args[i])
            i += 1
        for f in set_flags:
            value = params[f.dest]
            option = f.option
            assert option is not None
            if f.type == "bool":
                on = bool(value)
                # a store_true flag given when the value differs from its default of False
                if on != bool(f.default):
                    out_args.append(option)
                continue
            out_args += [option, _fmt_value(value)]
        return head + out_args

    def flags_text(self, params: Mapping[str, Any]) -> str:
        """``python train.py --lr 0.003 ...``: how to run the script with ``params`` (the flags at the
        parser's own default left out, the user's own ARGS kept)."""
        import shlex

        given = self.given_args()
        changed = {k: v for k, v in params.items()
                   if k in given or k not in self.flags or v != self.flags[k].default}
        return "python " + " ".join(shlex.quote(a) for a in self.command_for(changed))

    def cut_after(self, seconds: float | None) -> None:
        """Cut runs ``seconds`` after the next run starts, as at ``deadline`` (which still holds): a
        search's trials, whose timeout counts from its first trial, not from the call that starts
        the search (its study's setup: seconds on a loaded machine). None: off."""
        self._window, self._window_end = seconds, None

    # -- one evaluation -------------------------------------------------------------------------
    def call(self, params: Mapping[str, Any], seed: int | None = None, *,
             report: Callable[[int, float], bool] | None = None) -> dict[str, float]:
        """One run of the script with ``params`` (and ``--seed seed`` where it has the flag); its
        metrics. ``report(step, value)`` gets the first metric's values as they come; True ends
        the run (pruned). A non-zero exit or a missing metric raises :class:`ScriptFailed` with the
        script's last lines."""
        full = dict(params)
        if self.takes_seed and seed is not None:
            full["seed"] = int(seed)
        if self._window is not None and self._window_end is None:
            self._window_end = time.monotonic() + self._window
        ends = [t for t in (self.deadline, self._window_end) if t is not None]
        deadline = min(ends) if ends else None
        where = "the budget's end" if deadline == self.deadline else "the search's end (the race's time kept)"
        if deadline is not None and time.monotonic() >= deadline:
            raise ScriptCut(f"not started: {where} has passed")
        run = run_process(self.command_for(full), watch=self.metrics[0], profile=self.profile,
                          should_stop=report, grace_s=self.grace_s, timeout_s=self.timeout_s, deadline=deadline)
        self.runs.append(run)
        if run.cut:
            raise ScriptCut(f"cut at {where}, {run.duration_s:.1f} s into the run; its last lines:\n"
                            + "\n".join(run.tail[-8:]))
        if run.pruned:
            return {k: v for k, v in run.metrics.items()}
        if run.interrupted:
            raise ScriptFailed(f"the run was ended at {run.interrupted}; its last lines:\n" + "\n".join(run.tail[-8:]))
        if run.exit_code != 0:
            raise ScriptFailed(f"the script exited with code {run.exit_code}; its last lines:\n"
                               + "\n".join(run.tail[-12:]))
        missing = [m for m in self.metrics if m not in run.metrics]
        if missing:
            seen = ", ".join(sorted(run.metrics)) or "none"
            raise ScriptFailed(f"the script ended without reporting {', '.join(missing)} (metrics seen: {seen}); "
                               "print `NAME=value` lines or call proftune.report(NAME=value) (a Hugging Face "
                               "Trainer's are eval_NAME); its last lines:\n"
                               + "\n".join(run.tail[-8:]))
        return {**run.profile, **run.metrics}

    def output(self) -> list[str]:
        """The last lines the last run of the script printed (kept with its Run)."""
        return list(self.runs[-1].tail) if self.runs else []

    def source(self) -> str | None:
        """Where the first metric was read from in the last run that had it."""
        for run in reversed(self.runs):
            if self.metrics[0] in run.sources:
                return run.sources[self.metrics[0]]
        return None

    def describe_source(self) -> str:
        src = self.source()
        m = self.metrics[0]
        if src == "proftune.report":
            return f"{m} read from the script's proftune.report({m}=...) calls"
        if src == "lightning":
            return f"{m} read from the Lightning Trainer's logged metrics (self.log), through a callback"
        if src == "transformers":
            return (f"{m} read from the Hugging Face Trainer's eval metrics (what its evaluate() returns), "
                    "through a callback")
        if src == "tensorboard":
            return f"{m} read from the TensorBoard scalars the script writes (SummaryWriter.add_scalar), through a hook"
        if src == "stdout":
            return f"{m} read from `{m}=value` / `{m}: value` lines on the script's stdout"
        return f"{m} was not read yet"
