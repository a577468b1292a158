"""The documentation site: built in strict mode, every public name in its reference, opened in
headless Chromium from file:// as a reader would (navigation, search index, a screenshot)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import proftune

from ._blocks import ROOT


def _chromium_helpers() -> Any:
    """The report tests' headless Chromium (tests/report/_chromium.py), loaded by its path: the two
    test folders are separate packages."""
    spec = importlib.util.spec_from_file_location("_docs_chromium", ROOT / "tests" / "report" / "_chromium.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


CHROMIUM = _chromium_helpers()

#: Where the screenshots go (the tutorial and one reference page), to be looked at.
SHOTS = Path(os.environ.get("PROFTUNE_DOCS_SHOTS", "/tmp/proftune-docs-shots"))
#: The subpackages a user imports, each with its reference page (its ``__all__``).
SUBPACKAGES = ("compress", "diagnose", "examples", "integrations", "metrics", "optimize", "predict", "profile",
               "recommend", "report", "search", "task", "track", "train", "exceptions")


def _mkdocs_missing() -> str | None:
    for mod in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        try:
            importlib.import_module(mod)
        except ImportError:
            return f"{mod} is absent: pip install -e '.[docs]'"
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mkdocs build --strict`` of this checkout into a temp folder (a warning fails the build; not
    with ``-q``, under which mkdocs does not count warnings)."""
    missing = _mkdocs_missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return out


def _ids(page: Path) -> set[str]:
    return set(re.findall(r'id="(proftune[\w.]*)"', page.read_text()))


def test_every_public_name_has_a_reference_entry_with_its_docstring(site: Path) -> None:
    top = _ids(site / "reference" / "index.html")
    for name in proftune.__all__:
        if name == "__version__":
            continue
        module_callable = name in SUBPACKAGES  # proftune.compress(...) is proftune.compress.compress
        anchor = f"proftune.{name}.{name}" if module_callable else f"proftune.{name}"
        assert anchor in top, f"proftune.{name} has no entry in reference/index.md"
    text = (site / "reference" / "index.html").read_text()
    # a docstring's own words are on the page (the Task's, the Store's)
    for obj in (proftune.Task, proftune.Store, proftune.fit):
        first = (obj.__doc__ or "").strip().splitlines()[0]
        words = re.findall(r"[A-Za-z]{4,}", first)[:4]
        assert words, obj
        assert all(w in text for w in words), (obj, words)
    for sub in SUBPACKAGES:
        mod = importlib.import_module(f"proftune.{sub}")
        ids = _ids(site / "reference" / f"{sub}.html")
        absent = [n for n in getattr(mod, "__all__", ()) if f"proftune.{sub}.{n}" not in ids]
        assert not absent, f"reference/{sub}.md lacks {absent}"


def test_the_search_index_holds_every_page(site: Path) -> None:
    index = json.loads((site / "search" / "search_index.json").read_text())
    locations = {d["location"].split("#")[0] for d in index["docs"]}
    built = {str(p.relative_to(site)) for p in site.rglob("*.html") if p.name != "404.html"}
    built -= {"search.html"}
    assert built <= locations, sorted(built - locations)
    text = " ".join(d["text"] for d in index["docs"])
    for phrase in ("kept the defaults", "register_sampler", "paired seeds"):
        assert phrase in text, phrase


NAV_PROBE = ("[Array.prototype.map.call(document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]'),"
             " function(a){return [a.textContent.trim(), a.getAttribute('href')]}),"
             " document.querySelectorAll('.md-content img').length > 0 ?"
             " Array.prototype.map.call(document.querySelectorAll('.md-content img'), function(i){"
             "return [i.getAttribute('src'), i.naturalWidth]}) : [],"
             " document.querySelectorAll('.md-search__input').length]")


@contextlib.contextmanager
def _served(folder: Path) -> Iterator[str]:
    """The built site over HTTP on loopback, as ``mkdocs serve`` or any web server gives it (the
    search runs in a web worker, which a page from file:// may not start)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(CHROMIUM.chromium_missing() is not None, reason=str(CHROMIUM.chromium_missing()))
def test_the_site_opens_in_a_browser_with_its_navigation(site: Path) -> None:
    chromium, visit = CHROMIUM.chromium, CHROMIUM.visit
    SHOTS.mkdir(parents=True, exist_ok=True)
    with _served(site) as url, chromium() as browser:
        seen = visit(browser, f"{url}/tutorial.html", probe=NAV_PROBE)
        links, images, search_boxes = seen.probed
        labels = [label for label, _ in links]
        for wanted in ("Tutorial", "optimize", "The race and \"kept the defaults\"", "Extending proftune",
                       "proftune.search"):
            assert wanted in labels, (wanted, labels)
        for _, href in links:  # every navigation link leads to a built page
            target = (site / href.split("#")[0]) if not href.startswith("#") else site / "tutorial.html"
            assert target.resolve().is_file() or href in ("", "."), href
        assert search_boxes == 1
        assert images, "the tutorial shows the report's picture"
        assert all(width > 200 for _, width in images), images  # it loaded
        assert seen.exceptions == [], seen.exceptions
        outside = [u for u in seen.external_requests if not u.startswith(url)]
        assert outside == [], outside  # everything is in the site: no fonts, scripts or images from elsewhere
        assert "1. Install" in seen.text
        (SHOTS / "tutorial.png").write_bytes(seen.png)

        ref = visit(browser, f"{url}/reference/index.html")
        assert "proftune.Task" in ref.text
        assert "build_model" in ref.text
        assert ref.exceptions == []
        (SHOTS / "reference.png").write_bytes(ref.png)
