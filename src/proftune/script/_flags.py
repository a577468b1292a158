"""A script's parameters: its argparse flags, read in a child process without running its training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from .._records import JsonRecord, Reader
from ..exceptions import ConfigError
from ..profile import parse_command
from ._probe import Value

__all__ = ["Flag", "ScriptFlags", "child_env", "read_flags"]

#: Seconds a script may take to reach its ``parse_args`` (its imports: torch, lightning, ...).
PROBE_TIMEOUT_S = 120.0
#: Flag types a search can set (others, such as ``append`` or ``count`` actions, stay as given).
SETTABLE = ("int", "float", "str", "bool")


@dataclass(frozen=True)
class Flag(JsonRecord):
    """One argparse action: its ``dest`` (the param's name), its option strings, default, type
    (int, float, str, bool, or the action's kind) and choices; read from the probe's JSON of it."""

    WHAT: ClassVar[str] = "an argparse flag"
    READERS: ClassVar[dict[str, Reader]] = {"options": tuple, "choices": tuple}

    dest: str
    options: tuple[str, ...]
    default: Value
    type: str
    choices: tuple[Value, ...] | None = None
    nargs: int | str | None = None
    required: bool = False
    help: str | None = None

    @property
    def option(self) -> str | None:
        """The long option that sets it (``--batch-size``), or the first one; None: positional."""
        longs = [o for o in self.options if o.startswith("--")]
        named = longs or list(self.options)
        return named[0] if named else None

    @property
    def settable(self) -> bool:
        """A single value the command line can set: an optional flag of a plain type."""
        return bool(self.options) and self.type in SETTABLE and (self.type == "bool" or self.nargs in (None, "?"))


@dataclass(frozen=True)
class ScriptFlags(JsonRecord):
    """The flags of a script's argparse parser, in its order."""

    prog: str
    flags: tuple[Flag, ...]

    def __getitem__(self, dest: str) -> Flag:
        for f in self.flags:
            if f.dest == dest:
                return f
        raise KeyError(dest)

    def __contains__(self, dest: object) -> bool:
        return any(f.dest == dest for f in self.flags)

    @property
    def defaults(self) -> dict[str, Value]:
        """Each settable flag's default (the script's own values), by ``dest``."""
        return {f.dest: f.default for f in self.flags if f.settable}


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a script's child process: this one's, with proftune's own source first on
    ``PYTHONPATH`` (the child imports the proftune that runs here), and ``extra``."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in parts:
        parts.insert(0, here)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.update(extra or {})
    return env


def read_flags(command: Sequence[str], *, timeout: float = PROBE_TIMEOUT_S) -> ScriptFlags:
    """The argparse flags of ``python train.py ARGS`` (or ``-m pkg.mod``), read by running the script
    in a child process up to its ``parse_args`` call and no further: its training never runs.

    A script that ends, fails or hangs before it parses arguments is a :class:`ConfigError` saying
    that an argparse parser was expected, with the script's last lines."""
    kind, target, argv = parse_command(command)
    probe = Path(__file__).with_name("_probe.py")
    with tempfile.TemporaryDirectory(prefix="proftune-flags-") as tmp:
        out = Path(tmp) / "flags.json"
        where = ["-m", *argv] if kind == "module" else argv
        try:
            done = subprocess.run([sys.executable, str(probe), str(out), *where], env=child_env(),
                                  capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"reading the flags of {target!r}: the script did not reach an argparse "
                              f"parse_args() call within {timeout:g} s (proftune reads a script's "
                              "parameters from its argparse.ArgumentParser).") from None
        if not out.is_file():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            how = (f"it exited with code {done.returncode}" if done.returncode
                   else "it ended")
            raise ConfigError(
                f"{target!r} has no argparse flags to search: {how} without calling "
                "argparse.ArgumentParser.parse_args() (proftune reads a script's parameters from its "
                "argparse parser, its add_argument() calls)"
                + (f"; its last lines:\n{tail}" if tail else "."))
        raw = json.loads(out.read_text(encoding="utf-8"))
    return ScriptFlags(prog=str(raw["prog"]), flags=tuple(Flag.from_dict(a) for a in raw["actions"]))
