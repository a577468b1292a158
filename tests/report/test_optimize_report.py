"""The report of a real optimize run tells its whole story, and lays out as a person reads it in
a browser: every section holds something, no page overflows sideways, no table row is taller
than a few lines, the stages sit on one row."""

from __future__ import annotations

import re
from html import escape as html_escape
from pathlib import Path

import pytest

from .conftest import chromium_missing
from .test_html import _charts, _sections

SECTIONS = ["Result", "What changed", "Baseline", "Health", "Layer value", "Search", "Final race", "Compression",
            "Budget", "Files", "Run and environment"]

#: Evaluated in the page once every chart is drawn: the layout figures the test checks.
LAYOUT = """(function(){
  var lh = parseFloat(getComputedStyle(document.querySelector('table.data td')).lineHeight);
  var rows = Array.prototype.map.call(document.querySelectorAll('table.data tbody tr'), function(r){
    return [r.getBoundingClientRect().height, r.textContent.slice(0, 60)];});
  var tallest = rows.reduce(function(a, b){ return a[0] >= b[0] ? a : b; }, [0, '']);
  var chain = Array.prototype.map.call(document.querySelectorAll('.chain .stage'), function(b){
    return Math.round(b.getBoundingClientRect().top);});
  var empty = Array.prototype.filter.call(document.querySelectorAll('main section'), function(s){
    return !s.querySelector('table, .chart, img, .stat');}).map(function(s){ return s.id; });
  var wide = Array.prototype.filter.call(document.querySelectorAll('.tablewrap'), function(w){
    return w.scrollWidth > w.clientWidth + 1;}).map(function(w){
    return (w.closest('section') || {}).id + ': ' + (w.querySelector('h3') || w.querySelector('th')).textContent;});
  return {scroll: document.documentElement.scrollWidth, wide: wide, client: document.documentElement.clientWidth,
          lineHeight: lh, tallest: tallest, chain: chain, empty: empty,
          images: Array.prototype.filter.call(document.images, function(i){ return i.naturalWidth > 0; }).length};
})()"""


def _html(optimize_run: dict[str, object]) -> str:
    return (Path(str(optimize_run["out"])) / "report.html").read_text()


def test_every_section_of_the_story_holds_the_run_s_numbers(optimize_run: dict[str, object]) -> None:
    html = _html(optimize_run)
    result = optimize_run["result"]
    assert isinstance(result, dict)
    assert _sections(html) == SECTIONS
    titles = [f["layout"]["title"]["text"] for f in _charts(html)]
    for wanted in ("loss vs learning rate", "accuracy: no tricks, the defaults and the result",
                   "share of step time vs share of value per layer (%)", "accuracy of every trial, by arm",
                   "accuracy of every seed, per configuration", "accuracy vs latency at batch 1",
                   "seconds per stage: its share and what it spent"):
        assert wanted in titles, (wanted, titles)
    # every search trial drawn at its number, marked by the arm it came from
    from proftune.track import Store

    store = Store(str(optimize_run["db"]))
    search = next(r for r in store.list_runs(parent_id=result["run_id"]) if r.config.get("stage") == "search")
    numbers = {t["number"] for t in search.result["trials_log"]}
    history = next(f for f in _charts(html) if f["layout"]["title"]["text"] == "accuracy of every trial, by arm")
    assert {x for t in history["data"] if t.get("mode") == "markers" for x in t["x"]} == numbers
    arms = {t["name"] for t in history["data"]}
    assert "computed centre" in arms  # the first trial; the defaults the second, where one more ran
    assert "task defaults" in arms or len(numbers) < 2, (arms, numbers)
    # every seed of the race, on both splits
    race = next(f for f in _charts(html) if f["layout"]["title"]["text"] == "accuracy of every seed, per configuration")
    runs = sum(len(a["runs"]) for a in next(r for r in store.list_runs(parent_id=result["run_id"])
                                             if r.config.get("stage") == "final").result["race"]["arms"])
    assert [len(t["y"]) for t in race["data"]] == [runs, runs]
    # the headline: defaults -> result with the noise, held out, and the decision in words
    story = result["story"]
    assert html_escape(story["decision"]) in html
    assert html.count('class="stat ') >= 5
    # the PNGs the run wrote are in the page, not paths
    assert html.count('<img alt="') == len([v for v in result["files"].values() if str(v).endswith(".png")]) >= 3
    # the Config panel says it holds how the run started, not the result
    assert "as started: options and the task&#x27;s defaults" in html


@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
@pytest.mark.parametrize("width", [1400, 1024])
def test_the_report_lays_out_in_a_browser(optimize_run: dict[str, object], width: int) -> None:
    from ._chromium import chromium, visit

    path = Path(str(optimize_run["out"])) / "report.html"
    with chromium() as browser:
        seen = visit(browser, path, width=width, probe=LAYOUT)
    assert seen.console_errors == []
    assert seen.exceptions == []
    assert seen.external_requests == []
    assert seen.charts_drawn == seen.charts_expected >= 7
    got = seen.probed
    assert got["scroll"] <= got["client"], got  # nothing overflows the page sideways
    assert got["tallest"][0] <= 5 * got["lineHeight"] + 12, got["tallest"]  # no row taller than a few lines
    assert len(set(got["chain"])) == 1, got["chain"]  # the stages on one row: no arrow ends a line
    assert got["empty"] == [], got["empty"]
    assert got["wide"] == [], got["wide"]  # every table fits its section: no hidden columns
    assert got["images"] >= 3
    assert re.search(r"did it help\s+(yes|no)", seen.text)


@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
def test_a_long_recommended_value_wraps_instead_of_squeezing_its_reason(optimize_run: dict[str, object],
                                                                         tmp_path: Path) -> None:
    """On a busy machine the data_loading rule fires and recommends a whole DataLoader setting: the
    table of the other computed values keeps its rows a few lines tall (the value wraps)."""
    import sqlite3
    from types import SimpleNamespace

    from proftune.recommend._rules import data_loading_rule
    from proftune.report import write_report
    from proftune.track import Store

    from ._chromium import chromium, visit

    db = tmp_path / "runs.db"
    # SQLite's backup, not a file copy: the store runs in WAL mode, and its last commits (the run
    # finished) can still be in the -wal file while this process holds a connection open
    with sqlite3.connect(str(optimize_run["db"]).removeprefix("sqlite:///")) as src, sqlite3.connect(db) as dst:
        src.backup(dst)
    store = Store(f"sqlite:///{db}")
    busy = data_loading_rule(SimpleNamespace(step=SimpleNamespace(data_ms=6.0, time_ms=10.0), device="cpu"))
    assert isinstance(busy.value, dict)
    changed = 0
    for r in store.list_runs(kind="recommend"):
        result = dict(r.result or {})
        recs = [x for x in result.get("recommendations", []) if x.get("name") != "data_loading"]
        result["recommendations"] = [*recs, busy.to_dict()]
        store.update_run(r.id, result=result)
        changed += 1
    assert changed >= 1
    result = optimize_run["result"]
    assert isinstance(result, dict)
    path = write_report(result["run_id"], tmp_path / "report.html", store=store)
    assert "persistent_workers" in path.read_text()
    with chromium() as browser:
        seen = visit(browser, path, width=1024, probe=LAYOUT)
    got = seen.probed
    assert got["tallest"][0] <= 5 * got["lineHeight"] + 12, got["tallest"]
    assert got["wide"] == [], got["wide"]
