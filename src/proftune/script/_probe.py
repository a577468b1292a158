"""Run as a file in a child process (``python _probe.py OUT SCRIPT ARGS``), importing nothing of
proftune: read a script's argparse flags without running its training.

``ArgumentParser.parse_known_args`` (which ``parse_args`` calls) is patched to write the parser's
actions as JSON to OUT and end the process right there, as Guild AI reads a script's flags. A
script that ends without parsing its arguments writes nothing: the parent says what it expected.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import runpy
import sys
from typing import Any, TypedDict

_TYPES = {int: "int", float: "float", str: "str"}
#: A flag's default or choice as the JSON holds it (a value of another type as its text).
Value = bool | int | float | str | None


class Action(TypedDict):
    """One argparse action as the probe writes it: the fields of ``proftune.script.Flag``."""

    dest: str
    options: list[str]
    default: Value
    type: str
    choices: list[Value] | None
    nargs: int | str | None
    required: bool
    help: str | None


def _value(v: Any) -> Value:
    if v is None or isinstance(v, (bool, int, str)) or (isinstance(v, float) and math.isfinite(v)):
        return v
    return str(v)  # an inf default travels as its text


def _action(a: argparse.Action) -> Action | None:
    if isinstance(a, (argparse._HelpAction, argparse._VersionAction)) or a.dest == argparse.SUPPRESS:
        return None
    if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        kind = "bool"
    elif isinstance(a, argparse._StoreAction):
        known: Any = a.type
        kind = _TYPES.get(known, "str" if known is None else getattr(known, "__name__", "str"))
        if a.type is None and isinstance(a.default, (int, float)) and not isinstance(a.default, bool):
            kind = type(a.default).__name__
    else:
        kind = type(a).__name__  # append, count, ...: not searched
    return {"dest": a.dest, "options": list(a.option_strings), "default": _value(a.default), "type": kind,
            "choices": [_value(c) for c in a.choices] if a.choices is not None else None,
            "nargs": a.nargs if isinstance(a.nargs, (int, str)) or a.nargs is None else str(a.nargs),
            "required": bool(a.required), "help": a.help if isinstance(a.help, str) else None}


def main() -> None:
    out, target, argv = sys.argv[1], sys.argv[2], sys.argv[2:]

    def captured(self: argparse.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        actions = [d for a in self._actions if (d := _action(a)) is not None]
        with open(out, "w", encoding="utf-8") as fh:
            json.dump({"prog": self.prog, "actions": actions}, fh, allow_nan=False)
        sys.stdout.flush()
        os._exit(0)  # the training after the parse never runs

    argparse.ArgumentParser.parse_known_args = captured  # type: ignore[method-assign]
    sys.argv = argv
    if target == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
