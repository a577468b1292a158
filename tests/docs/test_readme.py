"""The README: its two commands at the top, a short tour and links into the site.

Its code blocks are the two commands; every other example lives on a page of the site
(``docs/``), where :mod:`tests.docs.test_pages` runs it. So each README block says which test
runs it: the main job is the tutorial's step 2, and the test command is what ``.ci/run`` runs.
"""

from __future__ import annotations

import re

from ._blocks import DOCS, ROOT, blocks

README = ROOT / "README.md"


def test_the_readme_is_short_and_its_two_commands_run_elsewhere_as_written() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 150
    found = blocks(README)
    assert [b.lang for b in found] == ["bash", "bash"], [b.where for b in found]
    main, ci = (b.code.strip().splitlines()[-1] for b in found)
    assert all(b.skip for b in found)
    # the main job: the tutorial runs this very command (tests/docs/test_pages.py)
    tutorial = (DOCS / "tutorial.md").read_text()
    for command in main.split("&&"):
        assert command.strip() in tutorial, command
    # the test command: .ci/run's last line, word for word
    assert ci == (ROOT / ".ci" / "run").read_text().rstrip().splitlines()[-1]
    # the site's strict build, and not quiet: under -q mkdocs does not count warnings, so nothing fails
    build = next(c for c in ci.split("&&") if "mkdocs build" in c).split()
    assert "--strict" in build
    assert "-q" not in build
    assert "--quiet" not in build


def test_the_readme_links_into_the_site() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(((?:docs/)[^)#]+)", text)
    assert len(links) >= 20
    for link in links:
        assert (ROOT / link).is_file(), link
    assert "docs/tutorial.md" in links
    assert "docs/extend.md" in links
    assert "docs/assets/report.png" in links
