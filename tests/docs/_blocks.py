"""Run the code blocks of a Markdown page (the README or a page of the site) as written.

A block before which the page says ``<!-- readme-test: NAME -->`` (``docs-test:`` on the site's
pages) is a file, written as NAME; ``skip (why)`` marks a block that cannot run inside a test,
with the reason on the page itself; ``output`` marks a ``text`` block that shows what the block
before it printed. Everything else runs: shell lines through the CLI (in-process),
``pip install -e ".[EXTRA]"`` checked against pyproject.toml, Python blocks one after the other
in one session per section. Budgets, trials and epochs are cut (:data:`QUICK`) so that a test
takes seconds to a few minutes: what a command does does not depend on how long it may run.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from proftune.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"(?:<!-- (?:readme|docs)-test: ([^\n]+?) -->\n)?```(\w+)\n(.*?)```", re.S)
#: How the test shortens a command: (pattern, replacement). Nothing else is changed.
QUICK = [(r"--budget \S+", "--budget 40"), (r'(?<![\w])budget="[^"]+"', "budget=40"), (r"--trials \d+", "--trials 2"),
         (r"(?<![\w-])trials=\d+", "trials=2"), (r"--epochs \d+", "--epochs 1"), (r"(?<![\w_])epochs=\d+", "epochs=1"),
         (r"--rounds \d+", "--rounds 2")]


#: What ``recommend --emit FRAMEWORK`` prints for each framework.
EMITTED = {"lightning": "L.Trainer(", "transformers": "TrainingArguments("}


@dataclass(frozen=True)
class Block:
    page: Path
    section: str
    line: int
    lang: str
    code: str
    marker: str | None

    @property
    def skip(self) -> str | None:
        m = re.fullmatch(r"skip \((.+)\)", self.marker or "")
        return m.group(1) if m else None

    @property
    def output(self) -> bool:
        return self.marker == "output"

    @property
    def file(self) -> str | None:
        return self.marker if self.marker and not self.skip and not self.output else None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` in order, each with the ``## `` section it stands in."""
    text = page.read_text()
    heads = [(m.start(), m.group(0)) for m in re.finditer(r"^## .*$", text, re.M)]
    out = []
    for m in BLOCK.finditer(text):
        section = next((h for pos, h in reversed(heads) if pos < m.start()), "(top)")
        out.append(Block(page, section, text[:m.start()].count("\n") + 1, m.group(2), m.group(3), m.group(1)))
    return out


def quick(code: str) -> str:
    for pattern, repl in QUICK:
        code = re.sub(pattern, repl, code)
    return code


def _extras() -> set[str]:
    """The extras pyproject.toml defines (``name = [...]`` under ``[project.optional-dependencies]``)."""
    text = (ROOT / "pyproject.toml").read_text()
    part = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^(\w+) = \[", part, re.M))


def _shell(block: Block) -> str:
    """Each command line of a shell block: ``proftune ...`` through the CLI, ``pip install`` checked.
    Returns what the commands printed (stdout and stderr)."""
    printed = []
    joined = re.sub(r"\\\n\s*", " ", block.code)
    for line in joined.splitlines():
        for cmd in (c.strip() for c in line.split("&&")):
            args = shlex.split(quick(cmd), comments=True)
            if not args:
                continue
            if args[:3] == ["pip", "install", "-e"]:
                extra = re.fullmatch(r"\.\[(\w+)\]", args[3])
                assert extra is not None, cmd
                assert extra.group(1) in _extras(), (block.where, cmd)
                continue
            assert args[0] == "proftune", (block.where, cmd)
            result = CliRunner().invoke(app, args[1:], env={"COLUMNS": "100"})
            assert result.exit_code == 0, (block.where, cmd, result.output[-3000:])
            if "--emit" in args:  # the snippet to paste is the framework's own call
                emitted = args[args.index("--emit") + 1]
                assert EMITTED.get(emitted, "") in result.stdout, (block.where, emitted)
            printed.append(result.output)
    return "".join(printed)


def _words(text: str) -> set[str]:
    """The words of an output (three letters or more): what a command says, not its numbers."""
    return {w.lower() for w in re.findall(r"[A-Za-z_]{3,}", text)}


def check_output(shown: Block, printed: str) -> None:
    """A page's output block was printed by the block before it: every word it shows is printed now
    (numbers and column widths change from run to run; a renamed field or message does not)."""
    missing = _words(shown.code) - _words(printed)
    assert not missing, f"{shown.where}: the page shows {sorted(missing)}, which the command no longer prints"


def run_section(page: Path, heading: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[Block]:
    """Run every block of ``page``'s sections starting with ``heading`` (files first written)."""
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    every = blocks(page)
    found = [b for b in every if b.section.startswith(heading)]
    assert found, (page, heading)
    # a real module, so that a page's dataclasses and pickles find the module they were defined in
    session = types.ModuleType("__docs__")
    monkeypatch.setitem(sys.modules, "__docs__", session)
    scope: dict[str, Any] = session.__dict__
    printed = ""
    for b in found:
        for name, code in files_before(every, b):
            (folder / name).write_text(code)
        if b.output:
            check_output(b, printed)
            continue
        if b.skip or b.file:
            continue
        if b.lang == "bash":
            printed = _shell(b)
        elif b.lang == "python":
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(quick(b.code), b.where, "exec"), scope)
            printed = out.getvalue()
        else:
            raise AssertionError(f"{b.where}: a {b.lang} block with no test marker")
    return found


def files_before(every: list[Block], b: Block) -> list[tuple[str, str]]:
    """Every file block of the page up to ``b`` (a section may use another's file: space.yaml)."""
    return [(x.file, x.code) for x in every if x.file and x.line <= b.line]
