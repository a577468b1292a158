"""The tutorial's text describes what its picture shows (issue 63: the text described a 5-minute run
that ended with an INT8 model, under a picture of a 90 s run that kept the uncompressed one).

The picture's facts are in its alt text and caption (the budget of the run it shows, and what that
run kept); the paragraph right above the picture must name the same budget and the same outcomes."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_paragraph_above_the_report_picture_describes_that_run() -> None:
    text = (DOCS / "tutorial.md").read_text()
    match = re.search(r"\n\n((?:[^\n]+\n)+)\n!\[([^\]]*)\]\(assets/report\.png\)\n\n\*([^\n]*)\*", text)
    assert match, "the tutorial shows the report's picture with a paragraph above it and a caption below"
    paragraph, alt, caption = (" ".join(g.split()) for g in match.groups())
    budget = re.search(r"--budget (\w+)", caption)
    assert budget, caption
    assert f"--budget {budget.group(1)}" in alt
    assert f"`--budget {budget.group(1)}`" in paragraph  # the same run as the picture
    # what the pictured run decided, as its alt text says, in the words of the paragraph
    for outcome in ("kept the defaults", "kept the uncompressed model"):
        assert outcome in alt
    assert "kept the task's defaults" in paragraph
    assert "kept the uncompressed model" in paragraph
    assert "INT8" not in paragraph  # that was the five-minute run's compressed result, not this one's
