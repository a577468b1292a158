"""The optimize page and story read the records a real optimize run left in the Store (the session's
``optimize_run``: TooSlowLR, 60 s), not a frozen JSON: every Run reads back as its record, the
page shows the record's numbers, and a field a producer renames fails where it is read."""

from __future__ import annotations

import html as htmllib
import json
import re
from typing import Any

import pytest

from proftune.exceptions import ConfigError
from proftune.optimize import STAGE_RECORDS, FinalOutputs, OptimizeResult, SearchStageOutputs
from proftune.optimize._story import tell
from proftune.report import render_report
from proftune.track import Store


def _sections(html: str) -> list[str]:
    return re.findall(r"<section id=\"[^\"]+\"><h2>(.*?)</h2>", html)


def _text(html: str) -> str:
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", html)).split())


@pytest.fixture(scope="module")
def stored(optimize_run: dict[str, Any]) -> tuple[Store, OptimizeResult]:
    store = Store(str(optimize_run["db"]))
    run = store.get_run(optimize_run["result"]["run_id"])
    return store, OptimizeResult.from_dict(dict(run.result))


def test_every_run_of_the_loop_reads_back_as_its_record(optimize_run: dict[str, Any],
                                                       stored: tuple[Store, OptimizeResult]) -> None:
    store, res = stored
    raw = store.get_run(res.run_id).result
    assert raw["schema_version"] == res.schema_version == 2  # 2: held-out figures from all of validation (issue 60)
    assert res.to_dict() == json.loads(json.dumps(raw))
    summary = optimize_run["result"]  # summary.json: the same record, with the report among its files
    assert OptimizeResult.from_dict(summary).to_dict() == summary
    for child in store.list_runs(parent_id=res.run_id):
        stage = child.config["stage"]
        assert STAGE_RECORDS[stage].from_dict(child.result).to_dict() == child.result, stage
    # the story is told from the record alone: the same sentences as the run printed
    assert tell(res) == res.story
    assert res.story.decision in str(optimize_run["output"])


def test_the_page_shows_the_record_s_numbers(stored: tuple[Store, OptimizeResult]) -> None:
    store, res = stored
    html = render_report(res.run_id, store=store)
    assert _sections(html)[:2] == ["Result", "What changed"]
    assert _sections(html)[-3:] == ["Budget", "Files", "Run and environment"]
    text = _text(html)
    vs = res.vs_baseline
    assert res.story.decision in text
    for line in res.story.lines:
        assert line.text in text
    d, f = vs.defaults.val, vs.final.val
    assert f"{d.mean:.3g}" in text
    assert f"{f.mean:.3g}" in text
    for row in res.stages:
        assert f'class="stage {row.status}"' in html
    race = next(c for c in store.list_runs(parent_id=res.run_id) if c.config["stage"] == "final")
    fin = FinalOutputs.from_dict(race.result)
    assert fin.race is not None
    runs = [r for a in fin.race.arms for r in a.runs]
    assert len(re.findall(r"<tr class=\"(?:best)?\"><td class=\"nw\">(?:defaults|search #\d)</td>", html)) == len(runs)
    srch = next(c for c in store.list_runs(parent_id=res.run_id) if c.config["stage"] == "search")
    search = SearchStageOutputs.from_dict(srch.result)
    for t in search.trials_log[:5]:
        assert t.state in text
    for c in res.final.changes:
        if c.changed:
            assert f"{c.param} " in text


def test_the_search_s_trials_file_and_log_are_the_search_s_trial_records(optimize_run: dict[str, Any],
                                                                       stored: tuple[Store, OptimizeResult]) -> None:
    """search_trials.json (its keys as first written) and the stage's log are read from the
    search's TrialRecords: the same numbers, states, values and arms."""
    store, res = stored
    srch = next(c for c in store.list_runs(parent_id=res.run_id) if c.config["stage"] == "search")
    log = SearchStageOutputs.from_dict(srch.result).trials_log
    rows = json.loads((optimize_run["out"] / "search_trials.json").read_text())
    assert {frozenset(r) for r in rows} == {frozenset({"number", "state", "params", "value", "reason", "anomalies",
                                                       "arm", "duration_s", "metrics", "steps", "gated", "epochs"})}
    assert [(r["number"], r["state"], r["value"], r["arm"]) for r in rows] == [
        (t.number, t.state, t.value, t.arm) for t in log]
    assert {t.arm for t in log} >= {"centre", "local"}  # the warm start's tags came back from the study (the
    # defaults were measured by the baseline at this protocol, not trained again)
    assert all(r["value"] is None for r in rows if r["state"] != "complete")  # a value is a complete trial's
    assert any(r["value"] is not None for r in rows)


def test_a_renamed_field_fails_and_the_page_says_so(stored: tuple[Store, OptimizeResult]) -> None:
    store, res = stored
    raw = dict(store.get_run(res.run_id).result)
    vs = dict(raw["vs_baseline"])
    vs["defaults"] = {"val": {("average" if k == "mean" else k): v for k, v in vs["defaults"]["val"].items()},
                      "test": vs["defaults"]["test"]}
    renamed = {**raw, "vs_baseline": vs}
    with pytest.raises(ConfigError, match=r"a seed summary.*average is not a field"):
        OptimizeResult.from_dict(renamed)
    with pytest.raises(ConfigError, match=r"schema_version=3, newer"):
        OptimizeResult.from_dict({**raw, "schema_version": 3})
    with pytest.raises(ConfigError, match="the_story is not a field"):
        OptimizeResult.from_dict({**raw, "the_story": raw["story"]})
    rid = store.start_run("optimize", res.task, config={"stage": None})
    store.finish_run(rid, status="finished", result=renamed)
    html = render_report(rid, store=store)
    assert _sections(html) == ["Result", "Run and environment"]
    assert "cannot be read as its record" in html
    assert "average is not a field" in html


def test_the_page_s_cards_sizes_and_layer_table_read_whole(stored: tuple[Store, OptimizeResult]) -> None:
    """Issue 39's report fixes: the result cards carry their sentences whole (no "…"), the model's
    size is one figure wherever it is shown, and the layer table shows what is left of the metric
    beside its drop (a drop near the whole metric is a layer the model cannot do without)."""
    from proftune._units import format_bytes

    store, res = stored
    page = render_report(res.run_id, store=store)
    headline = page[page.index('<div class="headline">'):]
    headline = headline[:headline.index("</section>")]
    assert "…" not in headline
    sizes = set(re.findall(r"\d+(?:\.\d+)? [KMG]iB", _text(headline)))
    assert format_bytes(res.final.size_bytes) in sizes
    if res.final.compressed is None:
        assert len(sizes) == 1, sizes
    assert "without it (of" in page
