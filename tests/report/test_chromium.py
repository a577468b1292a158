"""Reports as a person sees them: headless Chromium from file://, offline."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from proftune.report import write_report
from proftune.track import Store

from .conftest import chromium_missing, load_runs

XSS = "<script>alert(1)</script>"


def _distinct_colours(png: bytes) -> int:
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB").resize((200, 150))
    return len(img.getcolors(maxcolors=200 * 150) or [])


@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
def test_reports_load_offline_draw_and_run_no_injected_script(store: Store, tmp_path: Path) -> None:
    from ._chromium import chromium, visit

    ids = load_runs(store, task=XSS)
    pages = [write_report(study="s1", out=tmp_path / "study.html", store=store),
             write_report(ids["profile"], tmp_path / "profile.html", store=store)]
    control = tmp_path / "control.html"  # the harness sees what it must catch
    control.write_text(f"<html><body>{XSS}<img hidden src='http://127.0.0.1:9/x.png'></body></html>")
    with chromium() as browser:
        seen = visit(browser, control)
        assert seen.dialogs == ["1"]
        assert seen.external_requests == ["http://127.0.0.1:9/x.png"]
        assert _distinct_colours(seen.png) <= 2
        for page in pages:
            seen = visit(browser, page)
            assert seen.console_errors == [], page
            assert seen.exceptions == [], page
            assert seen.external_requests == [], page
            assert seen.dialogs == [], page  # the task name's alert(1) never ran
            assert seen.charts_expected >= 5, page
            assert seen.charts_drawn == seen.charts_expected, page
            assert XSS in seen.title
            assert XSS in seen.text
            assert _distinct_colours(seen.png) > 20, page  # not a blank page
            (tmp_path / f"{page.stem}.png").write_bytes(seen.png)
