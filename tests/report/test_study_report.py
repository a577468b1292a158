"""A study's report as a reader needs it: the best trial first, every trial drawn, a trials table
that keeps one line per trial, the scan's bounds and the strategy, importance that says why it is
empty."""

from __future__ import annotations

import html as htmllib
import re
from pathlib import Path
from typing import Any

import pytest

from proftune.report import render_report, write_report
from proftune.track import Store

from .conftest import chromium_missing, load_runs
from .test_html import _charts, _sections

LONG = "step_time_ms=1236 >= 20 (constraint step_time_ms<20); " * 6


def _study(store: Store, *, single: bool = False, **result: Any) -> str:
    ids = load_runs(store)
    tune = store.get_run(ids["tune"])
    config = {**tune.config, "objectives": ["accuracy:max"]} if single else tune.config
    if single:  # the study's record names its objectives too
        result = {"objectives": ["accuracy:max"], **result}
    store.update_run(tune.id, result={**tune.result, **result}, config=config)
    return render_report(study="s1", store=store)


def _text(html: str) -> str:
    return htmllib.unescape(re.sub(r"<[^>]+>", " ", html))


def test_the_best_trial_comes_first_and_every_trial_is_drawn(store: Store) -> None:
    html = _study(store)
    assert _sections(html)[0] == "Study"
    assert re.search(r'class="verdict good">Pareto front: 3 trial\(s\) \(#0, #2, #6\)<', html)
    single = _study(Store(store.url.replace(".db", "-1.db")), single=True)
    assert re.search(r'class="verdict good">best trial: #\d+: accuracy 1<', single)
    history = next(f for f in _charts(html) if f["layout"]["title"]["text"].startswith("accuracy of every trial"))
    drawn = {x for t in history["data"] if t.get("mode") == "markers" for x in t["x"]}
    numbers = [int(n) for n in re.findall(r'<tr class="\w+"><td class="num" data-v="(\d+)"', html)]
    assert len(numbers) == 8
    assert drawn == set(numbers)  # the infeasible ones too, though they have no accuracy
    gated = next(t for t in history["data"] if t["name"] == "infeasible: no accuracy")
    assert all("params=5251 &gt;= 3000" in h for h in gated["hovertext"])  # why, on hover
    # the legend sits on the left, clear of plotly's toolbar in the top-right corner
    assert all(f["layout"]["legend"]["xanchor"] == "left" for f in _charts(html))


def test_a_long_reason_stays_on_one_line_whole_on_hover(store: Store) -> None:
    ids = load_runs(store)
    trial = next(r for r in store.list_runs(kind="trial", study="s1") if r.result.get("state") == "infeasible")
    store.update_run(trial.id, result={**trial.result, "reason": LONG})
    html = render_report(study="s1", store=store)
    cells = re.findall(r'<td class="trunc" title="([^"]*)">([^<]*)</td>', html)
    whole = [shown for title, shown in cells if htmllib.unescape(title) == LONG]
    assert len(whole) == 1
    assert len(htmllib.unescape(whole[0])) <= 40
    assert LONG.startswith(htmllib.unescape(whole[0]).rstrip("…"))
    assert ids


def test_the_scan_s_bounds_and_the_strategy_are_shown(store: Store) -> None:
    scan = {"constraints": ["params<3000"], "profiles": 12, "duration_s": 3.2, "stopped_early": True,
            "feasible_share": 0.5, "kept_infeasible_share": 0.0, "notes": ["width: refined by bisection to 24"],
            "bounds": [{"param": "width", "op": "<=", "value": 24, "agree": 12, "total": 12,
                        "constraints": ["params<3000"], "text": "width <= 24 keeps params<3000"}], "points": []}
    strategy = [{"kind": "param", "subject": "width", "action": "restrict", "text": "restrict width to <= 24",
                 "evidence": {}}]
    html = _study(store, scan=scan, strategy=strategy)
    assert _sections(html)[:3] == ["Study", "Feasibility scan", "Strategy"]
    assert "width <= 24 12 of 12 params<3000" in " ".join(_text(html).split())
    assert "width: refined by bisection to 24" in html
    assert "restrict width to &lt;= 24" in html


def test_importance_says_why_a_method_gave_nothing(store: Store) -> None:
    imp = {"accuracy": {"fanova": {"lr": 0.7, "width": 0.3},
                        "ped_anova": {"lr": 0.5, "width": 0.2, "momentum": 0.3}}}
    html = _study(store, importance=imp)
    assert "fANOVA gives no value for momentum" in html
    html = _study(store, importance={"accuracy": {"fanova": {"error": "needs 2 trials"}, "ped_anova": {"lr": 1.0}}})
    assert "fANOVA gave nothing: needs 2 trials" in html


@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
def test_a_study_page_lays_out_in_a_browser(store: Store, tmp_path: Path) -> None:
    from ._chromium import chromium, visit
    from .test_optimize_report import LAYOUT

    load_runs(store)
    for trial in store.list_runs(kind="trial", study="s1"):
        if trial.result.get("state") == "infeasible":
            store.update_run(trial.id, result={**trial.result, "reason": LONG})
    path = write_report(study="s1", out=tmp_path / "study.html", store=store)
    with chromium() as browser:
        seen = visit(browser, path, width=1400, probe=LAYOUT)
    got = seen.probed
    assert seen.charts_drawn == seen.charts_expected
    assert got["scroll"] <= got["client"], got
    assert got["wide"] == [], got["wide"]
    assert got["tallest"][0] <= 3 * got["lineHeight"] + 12, got["tallest"]  # the long reasons: one line
