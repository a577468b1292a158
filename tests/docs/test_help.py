"""Each ``--help`` pasted into a page says what the command's ``--help`` says now.

The pages' output blocks are otherwise checked only for words that went missing
(:func:`tests.docs._blocks.check_output`), so a flag added or a help text reworded went unnoticed:
after the CLI's help texts were unified, 11 of the 17 pasted helps were out of date. Here every
row is compared, column by column, read so that wrapping does not count (:mod:`tests.docs._help`).
"""

from __future__ import annotations

import pytest

from ._help import Help, Pasted, Row, every_page, help_text, live, pasted

PASTED = [p for page in every_page() for p in pasted(page)]
REGENERATE = "paste it afresh: python -m tests.docs._help (from the repository root)"


def _row(row: Row | None) -> str:
    return " | ".join(" ".join(column) for column in row) if row else "(no row)"


def _difference(page: Help, now: Help) -> str:
    """The first thing the page says that the command no longer says, in a line or two."""
    if page.words != now.words:
        return f"usage and description\n  page: {' '.join(page.words)}\n  now:  {' '.join(now.words)}"
    if [t for t, _ in page.boxes] != [t for t, _ in now.boxes]:
        return f"boxes: the page has {[t for t, _ in page.boxes]}, the command {[t for t, _ in now.boxes]}"
    for (title, rows), (_, rows_now) in zip(page.boxes, now.boxes, strict=True):
        for i in range(max(len(rows), len(rows_now))):
            old = rows[i] if i < len(rows) else None
            new = rows_now[i] if i < len(rows_now) else None
            if old != new:
                return f"{title}, row {i + 1}\n  page: {_row(old)}\n  now:  {_row(new)}"
    return "(the same)"


def test_the_pages_show_the_help_of_the_commands_they_document() -> None:
    shown = {" ".join(p.args[:-1]) for p in PASTED}
    assert {"optimize", "tune", "lr-find", "bandit", "profile", "runs list"} <= shown, sorted(shown)
    assert len(PASTED) >= 17, [p.shown.where for p in PASTED]


@pytest.mark.parametrize("p", PASTED, ids=lambda p: f"{p.shown.page.name}:{' '.join(p.args[:-1])}")
def test_each_pasted_help_is_the_commands_help_now(p: Pasted) -> None:
    page, now = help_text(p.shown.code), help_text(live(p.args, p.width))
    assert page == now, (f"{p.shown.where}: the `proftune {' '.join(p.args)}` pasted there is not what the "
                         f"command prints now; {_difference(page, now)}\n{REGENERATE}")


@pytest.mark.parametrize("args", [["optimize", "--help"], ["bandit", "--help"], ["runs", "compare", "--help"]])
def test_the_help_reads_the_same_at_any_terminal_width(args: list[str]) -> None:
    at = {w: help_text(live(args, w)) for w in (80, 100, 160)}
    assert at[80] == at[100] == at[160]
    assert len(at[100].boxes) >= 1
    assert all(rows for _, rows in at[100].boxes)
    options = dict(at[100].boxes)["Options"]
    assert options[-1] == (("--help",), ("Show", "this", "message", "and", "exit.")), options[-1]


def test_a_changed_word_a_missing_row_or_a_moved_word_is_a_difference() -> None:
    p = next(p for p in PASTED if p.args == ["optimize", "--help"])
    ok = help_text(p.shown.code)
    reworded = help_text(p.shown.code.replace("Wall-clock budget", "Wall clock budget"))
    assert reworded != ok
    assert "row 1" in _difference(reworded, ok)
    lines = p.shown.code.splitlines()
    dropped = help_text("\n".join(x for x in lines if "--ignore-findings" not in x))
    assert dropped != ok
