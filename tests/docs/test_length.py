"""The pages read as steps, not as specifications (issue 63: table cells of 100-300 words, a
paragraph of 535 in a how-to, which a newcomer does not read).

A paragraph or a list item holds at most :data:`PARAGRAPH` words and a table cell
:data:`CELL`; detail beyond that goes to short steps or to the reference. The pages not yet split
are listed with their longest paragraph and cell, so that none grows and the list only shrinks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ._blocks import DOCS

PARAGRAPH = 150
CELL = 60
#: Pages not split yet: (longest paragraph, longest cell) in words, today's. Shrink, never grow;
#: none is left (issue 63 split the last fifteen), so a page that grows past the bounds fails.
NOT_YET: dict[str, tuple[int, int]] = {
}


def longest(page: Path) -> tuple[int, int]:
    """The words of the page's longest paragraph (or list item) and of its longest table cell,
    code blocks and test markers left out."""
    text = re.sub(r"```.*?```|<!--.*?-->", "", page.read_text(), flags=re.S)
    parts = re.split(r"\n\s*\n|\n(?=\s*(?:[-*]|\d+\.) )", text)
    paragraphs = [len(p.split()) for p in parts if not p.lstrip().startswith("|")]
    cells = [len(c.split()) for line in text.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]
    return max(paragraphs, default=0), max(cells, default=0)


def test_the_measure_sees_a_long_paragraph_a_long_cell_and_a_list_as_items(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("word " * 151 + "\n\n| a | " + "w " * 61 + "|\n\n```bash\n" + "x " * 999 + "\n```\n")
    assert longest(page) == (151, 61)
    page.write_text("Steps:\n\n1. " + "w " * 100 + "\n2. " + "w " * 100 + "\n- " + "w " * 100 + "\n")
    assert longest(page) == (101, 0)


@pytest.mark.parametrize("name", sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")))
def test_a_page_reads_as_short_steps(name: str) -> None:
    paragraph, cell = longest(DOCS / name)
    if name in NOT_YET:
        was_paragraph, was_cell = NOT_YET[name]
        grew = f"docs/{name} grew: its longest paragraph has {paragraph} words ({was_paragraph} before), " \
               f"its longest cell {cell} ({was_cell} before)"
        assert paragraph <= max(was_paragraph, PARAGRAPH), grew
        assert cell <= max(was_cell, CELL), grew
        assert paragraph > PARAGRAPH or cell > CELL, f"docs/{name} reads as short steps now: take it off NOT_YET"
        return
    assert paragraph <= PARAGRAPH, f"docs/{name}: a paragraph of {paragraph} words (at most {PARAGRAPH}): split it"
    assert cell <= CELL, f"docs/{name}: a table cell of {cell} words (at most {CELL}): move the detail out"
