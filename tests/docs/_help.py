"""The ``--help`` pasted into the pages, read as what it says rather than how it wraps.

A page shows ``proftune CMD --help`` and, in the ``output`` block after it, what the command
printed. :func:`help_text` reads that block as its parts: the text outside the boxes (usage,
description) as words, and each box (``Arguments``, ``Options``) as its rows, each row as the words
of each column. Wrapping moves words between lines of one column, never between columns or rows,
so two renderings at any widths read the same when the command says the same.

``python -m tests.docs._help`` (from the repository root) pastes each page's help afresh.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from proftune.cli import app

from ._blocks import DOCS, Block, blocks

#: A box's frame and its title: ``╭─ Options ──╮``.
_TOP = re.compile(r"^\s*╭─ (.+?) ─+╮\s*$")
_CELL = re.compile(r"\S+(?: \S+)*")  # a run of words with single spaces: one cell of a row's line

Row = tuple[tuple[str, ...], ...]  # the words of each column of one row


@dataclass(frozen=True)
class Help:
    """What a ``--help`` says: the words outside the boxes, then each box's title and rows."""

    words: tuple[str, ...]
    boxes: tuple[tuple[str, tuple[Row, ...]], ...]


@dataclass(frozen=True)
class Pasted:
    """A ``proftune ... --help`` block of a page and the output block that shows what it printed."""

    command: Block
    shown: Block

    @property
    def args(self) -> list[str]:
        return shlex.split(self.command.code.strip())[1:]

    @property
    def width(self) -> int:
        """The width it was rendered at: its widest line (a box spans the whole width)."""
        return max(len(line) for line in self.shown.code.splitlines())


def _rows(lines: list[str]) -> tuple[Row, ...]:
    """A box's rows. A row starts at the name column (or at its ``*`` required marker); every other
    line continues the row above, each of its cells in the column it starts under."""
    cells = [[(m.start(), m.group()) for m in _CELL.finditer(line)] for line in lines]
    cells = [c for c in cells if c]
    if not cells:
        return ()
    first = cells[0]
    name_at = first[1][0] if first[0][1] == "*" and len(first) > 1 else first[0][0]
    rows: list[list[tuple[int, list[str]]]] = []
    for line in cells:
        if line[0][0] <= name_at:  # a new row: its cells are the columns' starts
            rows.append([(at, text.split()) for at, text in line])
            continue
        assert rows, lines
        columns = rows[-1]
        for at, text in line:
            col = max((i for i, (start, _) in enumerate(columns) if start <= at), default=0)
            columns[col][1].extend(text.split())
    return tuple(tuple(tuple(words) for _, words in row) for row in rows)


def help_text(printed: str) -> Help:
    """Read a rendered ``--help`` (see the module's docstring)."""
    words: list[str] = []
    boxes: list[tuple[str, tuple[Row, ...]]] = []
    box: list[str] | None = None
    title = ""
    for line in printed.splitlines():
        top = _TOP.match(line)
        if top:
            title, box = top.group(1), []
        elif box is not None and line.strip().startswith("╰"):
            boxes.append((title, _rows(box)))
            box = None
        elif box is not None:
            inner = line.strip()
            box.append(inner[1:-1] if inner.startswith("│") and inner.endswith("│") else inner)
        else:
            words.extend(line.split())
    assert box is None, f"a box is not closed: {title}"
    return Help(tuple(words), tuple(boxes))


def pasted(page: Path) -> list[Pasted]:
    """Each ``proftune ... --help`` block of ``page`` with the output block after it."""
    found = blocks(page)
    out = []
    for b, after in itertools.pairwise(found):
        code = b.code.strip()
        if b.lang == "bash" and code.startswith("proftune ") and code.endswith(" --help") and "\n" not in code:
            assert after.output, f"{b.where}: `{code}` is not followed by an output block"
            out.append(Pasted(b, after))
    return out


def live(args: list[str], width: int) -> str:
    """What ``proftune ARGS`` prints in a terminal ``width`` columns wide."""
    result = CliRunner().invoke(app, args, env={"COLUMNS": str(width), "TERMINAL_WIDTH": str(width)})
    assert result.exit_code == 0, (args, result.output[-2000:])
    return result.output


def every_page() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _write() -> None:
    """Paste each page's ``--help`` afresh, at the width it has on the page."""
    for page in every_page():
        text = page.read_text()
        for p in reversed(pasted(page)):  # from the end, so that earlier offsets hold
            start = text.index(p.shown.code, sum(len(x) + 1 for x in text.splitlines()[: p.shown.line]))
            fresh = "\n".join(line.rstrip() for line in live(p.args, p.width).splitlines()).strip("\n")
            text = text[:start] + fresh + "\n" + text[start + len(p.shown.code):]
            print(f"{p.shown.where}: proftune {' '.join(p.args)}")
        page.write_text(text)


if __name__ == "__main__":
    _write()
