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
    from proftune.track import Store

    store = Store(str(optimize_run["db"]))
    compress = next(r for r in store.list_runs(parent_id=result["run_id"]) if r.config.get("stage") == "compress")
    skipped = (compress.result or {}).get("skipped")
    # a loaded machine can leave too little time to compress: then the section says why (the
    # layout test fills it); the chart is this run's only where it compressed
    compressed = () if skipped else ("accuracy vs latency at batch 1",)
    for wanted in ("loss vs learning rate", "accuracy: no tricks, the defaults and the result",
                   "share of step time vs share of value per layer (%)", "accuracy of every trial, by arm",
                   "accuracy of every seed, per configuration", *compressed,
                   "seconds per stage: its share and what it spent"):
        assert wanted in titles, (wanted, titles)
    if skipped:
        assert f"not tried: {html_escape(skipped)}" in html
    # every search trial drawn at its number, marked by the arm it came from
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
    held_out = result["vs_baseline"].get("held_out_source") or ""
    # held-out runs where the figures come from test data or resplits; an estimate has none
    assert [len(t["y"]) for t in race["data"]] == ([runs] if held_out.startswith("an estimate") else [runs, runs])
    # the headline: defaults -> result with the noise, held out, and the decision in words
    story = result["story"]
    assert html_escape(story["decision"]) in html
    assert html.count('class="stat ') >= 5
    # the PNGs the run wrote are in the page, not paths
    assert html.count('<img alt="') == len([v for v in result["files"].values() if str(v).endswith(".png")]) >= 3
    # the Config panel says it holds how the run started, not the result
    assert "as started: options and the task&#x27;s defaults" in html


#: The longest name a layer of a real model has (a Hugging Face encoder's), for the layer table.
LONG_LAYER = "encoder.layer.11.attention.output.dense_projection_with_bias"


def _fullest(optimize_run: dict[str, object], folder: Path, *, empty_search: bool = False) -> Path:
    """The real run's report with every section at its fullest, whatever that run measured: each
    layer with the longest finding the layer-value stage writes (and one with a long name), a
    recommendation whose value is a whole DataLoader setting, eight compression candidates; with
    ``empty_search``, a search where every trial but one was pruned. What a page shows depends on
    what one run measured (a finding appears under load, not on a quiet machine): its layout is
    tested on the most it can hold."""
    import sqlite3
    from types import SimpleNamespace

    from proftune.recommend._rules import data_loading_rule
    from proftune.report import write_report
    from proftune.track import Store

    db = folder / "runs.db"
    # SQLite's backup, not a file copy: the store runs in WAL mode, and its last commits (the run
    # finished) can still be in the -wal file while this process holds a connection open
    with sqlite3.connect(str(optimize_run["db"]).removeprefix("sqlite:///")) as src, sqlite3.connect(db) as dst:
        src.backup(dst)
    store = Store(f"sqlite:///{db}")
    result = optimize_run["result"]
    assert isinstance(result, dict)
    busy = data_loading_rule(SimpleNamespace(step=SimpleNamespace(data_ms=6.0, time_ms=10.0), device="cpu"))
    assert isinstance(busy.value, dict)
    for r in store.list_runs(kind="recommend"):
        res = dict(r.result or {})
        res["recommendations"] = [*(x for x in res.get("recommendations", []) if x.get("name") != "data_loading"),
                                  busy.to_dict()]
        store.update_run(r.id, result=res)
    for child in store.list_runs(parent_id=result["run_id"]):
        stage, res = (child.config or {}).get("stage"), dict(child.result or {})
        if stage == "layer_value" and res.get("layers"):
            layers = [dict(x) for x in res["layers"]]
            layers[0]["name"] = LONG_LAYER
            for x in layers:
                x["finding"] = (f"{x['name']} ({x['type']}) takes 37% of the step time, 12% of the params and 12% "
                                "of the MACs, but replacing its output by its mean costs only 0.001234 accuracy "
                                "(3% of the measured contribution)")
                x["action"] = "replace it by a smaller one, or prune it harder than the rest"
            res["layers"] = layers
            res["findings"] = [{"layer": x["name"], "finding": x["finding"], "action": x["action"]} for x in layers]
        elif stage == "search" and empty_search and res.get("trials_log"):
            log = [{**t, "state": "pruned", "value": None, "reason": "below the median of the trials at epoch 1 "
                    "(successive halving): 0.8123 against 0.8456"} for t in res["trials_log"]]
            log[0] = res["trials_log"][0]
            res["trials_log"], res["counts"] = log, {"complete": 1, "pruned": len(log) - 1}
        elif stage == "compress" and res.get("run_id") is not None:
            crun = store.get_run(int(res["run_id"]))
            cres = dict(crun.result or {})
            cands = list(cres.get("candidates") or [])
            if cands:
                cres["candidates"] = [{**cands[i % len(cands)], "ratio": round(0.1 * (i + 1), 2)} for i in range(8)]
                store.update_run(crun.id, result=cres)
        elif stage == "compress":  # skipped in the run (too little time left under load): the most it holds
            res = _eight_candidates()
        else:
            continue
        store.update_run(child.id, result=res)
    return write_report(result["run_id"], folder / "report.html", store=store)


def _eight_candidates() -> dict[str, object]:
    """A compress stage's outputs with eight candidates, every figure filled (as a sweep that ran)."""
    from proftune.optimize._records import CompressOutputs, ModelFigures

    methods = ["structured+dynamic", "structured", "unstructured+static", "dynamic"]
    cands = [ModelFigures(method=methods[i % 4], ratio=round(0.1 * (i + 1), 2), metric=0.93 - 0.01 * i,
                          metric_drop=0.01 * i, latency_ms=0.05 + 0.001 * i, latency_batch_ms=0.3,
                          params=5000 - 400 * i,
                          size_bytes=24000 - 2000 * i, batch_size=32, within_budget=i < 5) for i in range(8)]
    base = ModelFigures(metric=0.93, latency_ms=0.06, latency_batch_ms=0.4, size_bytes=26000, params=5251,
                        batch_size=32)
    return CompressOutputs(verdict="structured+dynamic at ratio 0.2 is 1.2x faster at batch 1 within the budget",
                           baseline=base, selected=cands[1], candidates=cands,
                           ratios=[c.ratio for c in cands if c.ratio is not None]).to_dict()


@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
@pytest.mark.parametrize(("width", "empty_search"), [(1400, False), (1024, False), (1024, True)])
def test_the_report_lays_out_in_a_browser(optimize_run: dict[str, object], tmp_path: Path, width: int,
                                          empty_search: bool) -> None:
    from ._chromium import chromium, visit

    path = _fullest(optimize_run, tmp_path, empty_search=empty_search)
    html = path.read_text()
    assert LONG_LAYER in html
    assert "persistent_workers" in html  # the recommendation whose value is a whole DataLoader setting
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
    if empty_search:
        assert re.search(r"1 of \d+ trial\(s\) produced a value", seen.text)  # says why there is no line
