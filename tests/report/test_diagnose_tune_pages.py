"""The diagnose, bandit and tune pages rendered from what their producers record now (a real
``proftune.diagnose``, ``proftune.bandit`` and ``proftune.search`` of digits-mlp, a few steps
each), not from a frozen JSON: a field a producer renames fails here, and a run whose result
cannot be read says so on its page."""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest

import proftune
from proftune.diagnose import Arm, BanditResult, DiagnoseResult, bandit
from proftune.report import render_report
from proftune.search import SearchResult
from proftune.track import Store

from .test_html import _charts, _sections


def _text(html: str) -> str:
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", html)).split())


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'proftune.db'}"


@pytest.fixture(scope="module")
def diagnosed(db: str) -> DiagnoseResult:
    # SGD at lr 5: gradients explode and ReLUs die within a few dozen steps: findings, one with a consequence
    return proftune.diagnose("digits-mlp", {"lr": 5.0, "optimizer": "sgd", "hidden": 16}, max_steps=40,
                             lr_test=False, probes=False, device="cpu", store=db)


def test_diagnose_page_renders_the_recorded_record(db: str, diagnosed: DiagnoseResult) -> None:
    assert diagnosed.findings, "the broken config should give findings"
    html = render_report(diagnosed.run_id, store=Store(db))
    assert _sections(html) == ["Overview", "Findings", "Curves"]
    text = _text(html)
    for i, f in enumerate(diagnosed.findings, start=1):
        assert f"{i}. {f.cause}" in text
        assert f.summary in text
        assert f"fix: {f.fix}" in text
        for j, c in enumerate(f.consequences, start=1):
            assert f"{i}.{j}. {c.cause}" in text
    loss = next(c for c in _charts(html) if c["layout"]["title"]["text"] == "loss per step")
    marked = [s["x0"] for s in loss["layout"]["shapes"]]
    for f in diagnosed.findings:
        if f.step is not None:
            assert f.step in marked


def test_diagnose_record_round_trips_through_its_run(db: str, diagnosed: DiagnoseResult) -> None:
    stored = Store(db).get_run(diagnosed.run_id).result
    assert stored["schema_version"] == diagnosed.schema_version == 1
    again = DiagnoseResult.from_dict(stored)
    assert again.to_dict() == json.loads(json.dumps(stored))
    assert [f.cause for f in again.findings] == [f.cause for f in diagnosed.findings]
    assert again.metrics == diagnosed.metrics
    with pytest.raises(AttributeError):
        diagnosed.steps = 0  # type: ignore[misc]  # a frozen record
    legacy = {k: v for k, v in stored.items() if k != "schema_version"}  # before records had a version
    assert DiagnoseResult.from_dict(legacy).to_dict() == again.to_dict()
    renamed = {**stored, "findings": [{("text" if k == "summary" else k): v for k, v in stored["findings"][0].items()}]}
    with pytest.raises(proftune.ConfigError, match=r"no field summary; text is not a field"):
        DiagnoseResult.from_dict(renamed)  # a renamed field fails, it does not render as blank
    with pytest.raises(proftune.ConfigError,
                       match=r"schema_version=2, newer than this proftune reads \(schema_version 1\)"):
        DiagnoseResult.from_dict({**stored, "schema_version": 2})


def test_a_result_that_cannot_be_read_says_so_on_its_page(db: str, diagnosed: DiagnoseResult) -> None:
    store = Store(db)
    rid = store.start_run("diagnose", "digits-mlp", config={})
    stored = store.get_run(diagnosed.run_id).result
    store.finish_run(rid, status="finished", result={**{k: v for k, v in stored.items() if k != "steps"},
                                                      "n_steps": 40})
    html = render_report(rid, store=store)
    assert _sections(html) == ["Overview", "Result"]
    assert "cannot be read as its record" in html
    assert "n_steps is not a field" in html
    assert "no field steps" in html


@pytest.fixture(scope="module")
def bandit_result(db: str) -> BanditResult:
    arms = [Arm("tuned", {"lr": 0.01}), Arm("tiny", {"lr": 1e-5})]
    return bandit("digits-mlp", arms, rounds=3, max_steps=8, device="cpu", store=db)


def test_bandit_page_renders_the_recorded_record(db: str, bandit_result: BanditResult) -> None:
    html = render_report(bandit_result.run_id, store=Store(db))
    assert _sections(html) == ["Overview", "Allocation", "Regret"]
    charts = _charts(html)
    pulls = charts[0]["data"][0]
    assert pulls["x"] == [a.arm for a in bandit_result.arms]
    assert pulls["y"] == [a.pulls for a in bandit_result.arms]
    assert sum(pulls["y"]) == bandit_result.total_pulls == 3
    assert charts[1]["data"][0]["y"] == pytest.approx(bandit_result.regret)
    text = _text(html)
    assert f"best: {bandit_result.best}" in text
    for p in bandit_result.pulls:
        assert f"{p.round} {p.arm}" in text


def test_bandit_record_round_trips_through_its_run(db: str, bandit_result: BanditResult) -> None:
    stored = Store(db).get_run(bandit_result.run_id).result
    again = BanditResult.from_dict(stored)
    assert again.to_dict() == json.loads(json.dumps(stored))
    assert again.pulls == bandit_result.pulls
    assert [a.arm for a in again.arms] == [a.arm for a in bandit_result.arms]
    metric = again.metric
    renamed = {**stored,
               "pulls": [{("reward" if k == metric else k): v for k, v in p.items()} for p in stored["pulls"]]}
    with pytest.raises(proftune.ConfigError, match="reward is not a field"):
        BanditResult.from_dict(renamed)
    with pytest.raises(proftune.ConfigError, match="no field best"):
        BanditResult.from_dict({k: v for k, v in stored.items() if k != "best"})


SPACE = {"params": {"hidden": {"type": "categorical", "choices": [8, 16, 128]},
                    "lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True}}}


@pytest.fixture(scope="module")
def searched(db: str) -> SearchResult:
    # hidden 128 breaks params<3000 (gated before training); a 4-point scan runs first
    return proftune.search("digits-mlp", SPACE, objectives=["accuracy:max"], constraints=["params<3000"], trials=3,
                           max_steps=8, sampler="random", scan=4, seed=1, study="s", device="cpu", store=db)


def test_tune_page_renders_the_recorded_record(db: str, searched: SearchResult) -> None:
    html = render_report(searched.run_id, store=Store(db))
    assert _sections(html) == ["Study", "Feasibility scan", "Strategy", "Optimisation history", "Trials",
                               "Parallel coordinates", "Parameter importance", "Correlations", "Run and environment"]
    text = _text(html)
    best = searched.best
    assert best is not None
    assert f"best trial: #{best.number}: accuracy {best.metrics['accuracy']:.4g}" in text
    tally = searched.tally
    assert f"trials trained / gated {tally.trained} / {tally.gated}" in text
    assert tally.trained == 3
    assert searched.scan is not None
    assert f"{searched.scan.profiles} configurations profiled, not trained" in text
    for st in searched.strategy:
        assert st.text in text
    assert text.count(" complete ") + text.count(" infeasible ") >= len(searched.trials)
    imp = next(c for c in _charts(html) if c["layout"]["title"]["text"] == "importance for accuracy")
    fanova = next(t for t in imp["data"] if t["name"] == "fANOVA")
    assert dict(zip(fanova["y"], fanova["x"], strict=True)) == pytest.approx(searched.importance["accuracy"]["fanova"])


def test_tune_record_round_trips_through_its_run(db: str, searched: SearchResult) -> None:
    stored = Store(db).get_run(searched.run_id).result
    assert "trials" not in stored  # each trial is its own Run (and in the study)
    again = SearchResult.from_dict(stored)
    assert again.to_dict(trials=False) == json.loads(json.dumps(stored))
    assert again.trials == []
    assert again.counts() == searched.counts()
    assert again.budget() == searched.budget()
    assert again.compute() == searched.compute()
    assert again.best == searched.best
    assert again.objectives == searched.objectives
    assert again.constraints == searched.constraints
    whole = SearchResult.from_dict(json.loads(json.dumps(searched.to_dict())))
    assert whole.trials == searched.trials
    assert whole.strategy == searched.strategy
    assert whole.scan == searched.scan
    renamed = {**stored, "best": {("why" if k == "reason" else k): v for k, v in stored["best"].items()}}
    with pytest.raises(proftune.ConfigError, match=r"a search trial .*no field reason; why is not a field"):
        SearchResult.from_dict(renamed)
    with pytest.raises(proftune.ConfigError, match="no budget"):
        SearchResult.from_dict({k: v for k, v in stored.items() if k != "budget"})


def test_a_trial_run_that_cannot_be_read_says_so_on_the_study_page(db: str, searched: SearchResult) -> None:
    store = Store(db)
    trial = store.list_runs(kind="trial", study="s")[0]
    good = dict(trial.result)
    store.update_run(trial.id, result={("why" if k == "reason" else k): v for k, v in good.items()})
    try:
        html = render_report(study="s", store=store)
    finally:
        store.update_run(trial.id, result=good)
    assert "1 trial run(s) cannot be read as their record" in html
    assert "why is not a field" in html
