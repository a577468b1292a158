"""ARCHITECTURE.md names every module of src/proftune, and names none that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "proftune"


def _index() -> set[str]:
    """The modules the page's "Every module, by package" section lists, as paths below src/proftune."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## Every module, by package", 1)[1]
    listed: set[str] = set()
    package = ""
    for line in section.splitlines():
        head = re.match(r"\*\*(\S+)/\*\*", line)
        if head:
            package = "" if head[1] == "proftune" else head[1]
            continue
        row = re.match(r"- `([^`]+\.py)`: \S", line)
        if row:
            listed.add(f"{package}/{row[1]}" if package else row[1])
    return listed


def test_every_module_is_named_once_and_each_named_one_exists() -> None:
    modules = {p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py")}
    listed = _index()
    assert sorted(modules - listed) == [], "modules ARCHITECTURE.md does not name"
    assert sorted(listed - modules) == [], "ARCHITECTURE.md names modules that are gone"
