"""The HTML report: a page for every kind of run, escaped user strings, one plotly bundle, size."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from proftune.exceptions import ConfigError
from proftune.profile import Profile
from proftune.report import (
    RENDERERS,
    Context,
    Page,
    compare_html,
    register_renderer,
    render_report,
    run_page,
    write_report,
)
from proftune.track import RunRecord, Store

from .conftest import load_runs

XSS = "<script>alert(1)</script>"
PLOTLY_MARK = "plotly.js v"  # the bundle's banner comment


def _charts(html: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in re.findall(r'<script type="application/json" data-chart="[^"]+">(.*?)</script>',
                                              html, re.S)]


def _sections(html: str) -> list[str]:
    return re.findall(r"<section id=\"[^\"]+\"><h2>(.*?)</h2>", html)


@pytest.mark.parametrize(("kind", "sections", "min_charts"), [
    ("train", ["Overview", "Training", "Curves"], 2),
    ("profile", ["Overview", "Profile", "Step breakdown", "Memory", "Layers", "Statistics per layer",
                 "Bottlenecks", "By layer type"], 5),
    ("lr_find", ["Overview", "LR range test"], 1),
    ("batch_size", ["Overview", "Memory model"], 1),
    ("recommend", ["Overview", "Recommendations"], 0),
    ("diagnose", ["Overview", "Findings", "Curves"], 2),
    ("tune", ["Study", "Optimisation history", "Trials", "Parallel coordinates",
              "Parameter importance", "Correlations", "Pareto front", "Run and environment"], 8),
    ("trial", ["Overview", "Trial", "Curves"], 1),
    ("compress", ["Overview", "Candidates", "Plan and notes"], 2),
    ("bandit", ["Overview", "Allocation", "Regret"], 2),
])
def test_every_kind_has_its_sections(store: Store, runs: dict[str, int], kind: str, sections: list[str],
                                     min_charts: int) -> None:
    html = render_report(runs[kind], store=store)
    assert _sections(html) == sections
    charts = _charts(html)
    assert len(charts) >= min_charts
    for fig in charts:
        assert fig["data"], fig["layout"].get("title")
    assert html.count(PLOTLY_MARK) == (1 if charts else 0)
    assert "cdn" not in html.split("<script>", 1)[0].lower()  # nothing fetched from a CDN


def test_numbers_beside_charts_are_the_runs(store: Store, runs: dict[str, int]) -> None:
    lr = store.get_run(runs["lr_find"])
    html = render_report(lr.id, store=store)
    fig = _charts(html)[0]
    xs = fig["data"][0]["x"]
    assert xs == [p["lr"] for p in lr.curves["lr_range"]]
    suggested = lr.result["suggested_lr"]
    assert any(s.get("x0") == suggested for s in fig["layout"]["shapes"])
    trials = store.list_runs(kind="trial")
    tune = render_report(runs["tune"], store=store)
    infeasible = [t for t in trials if t.result["state"] == "infeasible"]
    assert infeasible
    assert infeasible[0].result["reason"] in tune.replace("&gt;", ">").replace("&lt;", "<")
    assert "Spearman correlation" in tune
    assert "Pearson correlation" in tune


def test_user_strings_are_text_never_markup(store: Store) -> None:
    ids = load_runs(store, task=XSS)
    rid = ids["tune"]
    store.update_run(rid, config={**store.get_run(rid).config, "objectives": [f"{XSS}:max"]},
                     error=f"ValueError: {XSS}")
    for kind in ("tune", "diagnose", "profile", "compress", "train"):
        html = render_report(ids[kind], store=store)
        assert XSS not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        for block in re.findall(r'data-chart="[^"]+">(.*?)</script>', html, re.S):
            assert "</" not in block
            assert "<" not in block
        # only our own scripts: the plotly bundle, the charts' JSON and the page's script
        assert html.count("<script") == html.count("</script>")
    study = render_report(study="s1", store=store)
    assert XSS not in study


def test_chart_labels_escape_for_plotly(store: Store) -> None:
    ids = load_runs(store)
    trial = store.get_run(ids["trial"])
    store.update_run(trial.id, config={**trial.config, "params": {**trial.config["params"], XSS: 1.0}})
    html = render_report(study="s1", store=store)
    figs = _charts(html)
    labels = json.dumps(figs)
    assert XSS not in labels
    assert "&lt;script&gt;" in labels


def test_hundred_trial_study_is_one_file_under_10_mb(store: Store, tmp_path: Path) -> None:
    load_runs(store)
    tune = store.list_runs(kind="tune")[0]
    template = store.get_run(store.list_runs(kind="trial")[-1].id)
    for i in range(100):
        rid = store.start_run("trial", tune.task, config={"params": {"hidden": 8 * (i % 8 + 1), "lr": 1e-3 * (1 + i),
                                                                     "dropout": i / 200}, "trial": 100 + i},
                              study=tune.study, parent_id=tune.id)
        store.update_run(rid, status="finished", metrics={**template.metrics, "accuracy": 0.5 + i / 250},
                         curves=template.curves, result={**template.result, "trial": 100 + i, "state": "complete"})
    path = write_report(study=tune.study, out=tmp_path / "study.html", store=store)
    size = path.stat().st_size
    assert 4_000_000 < size < 10 * 2**20
    html = path.read_text()
    assert html.count(PLOTLY_MARK) == 1
    assert html.count("<tr class=\"complete\">") >= 100


def test_profile_from_a_file_and_from_the_object(store: Store, runs: dict[str, int], tmp_path: Path) -> None:
    profile = Profile.from_dict(store.get_run(runs["profile"]).result)
    saved = profile.save(tmp_path / "p.json")
    from_file = write_report(str(saved), tmp_path / "p.html")
    assert "Layers" in _sections(from_file.read_text())
    html = render_report(Profile.from_dict({**profile.to_dict(), "config": {}}))
    assert "Layers" in _sections(html)
    assert "Overview" not in _sections(html)


def test_compare_overlays_curves_and_diffs(store: Store, runs: dict[str, int]) -> None:
    html = compare_html(runs["train"], runs["diagnose"], store=store)
    assert _sections(html) == ["Summary", "Metrics", "Config", "Environment", "Curves"]
    loss = next(f for f in _charts(html) if f["layout"]["title"]["text"] == "loss per step")
    assert [t["name"] for t in loss["data"]] == [f"run {runs['train']}", f"run {runs['diagnose']}"]
    assert "same data" in html


def test_optimize_stage_chain_and_custom_renderers(store: Store) -> None:
    from proftune.optimize import OptimizeResult, StageRow

    result = OptimizeResult(task="digits-cnn", study="s", run_id=99, out="o", objective="accuracy:max", budget_s=60.0,
                            elapsed_s=35.5, stages=[
                                StageRow(name="baseline", duration_s=12.0, metric_after=0.9),
                                StageRow(name="compute", duration_s=3.5, metric_before=0.9, metric_after=0.93),
                                StageRow(name="compress", duration_s=20.0, metric_before=0.93, metric_after=0.925,
                                         status="finished", run_id=7)])
    record = RunRecord(id=99, kind="optimize", task="digits-cnn", status="finished", started_at="2026-01-01T00:00:00",
                       result=result.to_dict())
    html = run_page(record, store).render()
    # the story first, the run's overview last; its stages in one row of boxes (no arrow ends a line)
    assert _sections(html)[0] == "Result"
    assert _sections(html)[-1] == "Run and environment"
    assert html.count('class="stage') == 3
    assert "grid-template-columns:repeat(3,minmax(0,1fr))" in html
    assert 'class="arrow"' not in html
    seen = []

    @register_renderer("custom_kind")
    def _render(page: Page, r: RunRecord, ctx: Context) -> None:
        seen.append(r.id)
        page.section("Mine").para("hello")

    try:
        html = run_page(RunRecord(id=5, kind="custom_kind", task="t", status="finished", started_at="x"),
                        store).render()
        assert seen == [5]
        assert "Mine" in _sections(html)
        with pytest.raises(ConfigError, match="report page named 'custom_kind' is registered already"):
            register_renderer("custom_kind")(lambda page, r, ctx: None)
    finally:
        RENDERERS.remove("custom_kind")
    assert "custom_kind" not in RENDERERS


def test_recommend_with_a_budget_shows_the_memory_model(store: Store, runs: dict[str, int]) -> None:
    rec = store.get_run(runs["recommend"])
    search = store.get_run(runs["batch_size"]).result
    items = [dict(r) for r in rec.result["recommendations"]]
    items[0]["evidence"] = {**items[0]["evidence"], "max_batch_size": search["max_batch_size"],
                            "memory_budget": search["memory_budget"], "memory_model": search["model"],
                            "measured_peak_bytes": search["measured_peak_bytes"], "limited_by": "memory",
                            "search": search}
    store.update_run(rec.id, result={"recommendations": items})
    html = render_report(rec.id, store=store)
    assert _sections(html) == ["Overview", "Recommendations", "Memory model"]
    fig = _charts(html)[0]
    assert any(t["name"].startswith("fitted") for t in fig["data"])
    assert any(s.get("x0") == search["max_batch_size"] for s in fig["layout"]["shapes"])
    probes = [x for t in fig["data"] if t["name"].startswith("probe") for x in t["x"]]
    assert sorted(probes) == sorted(p["batch_size"] for p in search["probes"])
    # recorded before the evidence held the search: the section says what is missing, no chart of made-up probes
    del items[0]["evidence"]["search"]
    store.update_run(rec.id, result={"recommendations": items})
    html = render_report(rec.id, store=store)
    assert _sections(html) == ["Overview", "Recommendations", "Memory model"]
    assert "not in this run" in html
    assert not _charts(html)
