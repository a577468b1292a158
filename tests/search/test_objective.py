"""A plain Python objective searched like a Task; noise-aware selection; a user's own sampler and pruner."""

from __future__ import annotations

import random
from pathlib import Path

import optuna
import pytest

import proftune
from proftune.exceptions import ConfigError
from proftune.search import SearchResult
from proftune.search._reeval import Group, groups, next_repeat, pick, select

SPACE = {"params": {"x": {"type": "float", "low": -1.0, "high": 1.0}}}


def noisy(params: dict, seed: int) -> dict:
    """(x - 0.3)^2 plus noise that a seed fixes: a repeat with a new seed draws new noise."""
    rng = random.Random(seed * 1_000_003 + int(params["x"] * 1e6))
    return {"loss": (params["x"] - 0.3) ** 2 + rng.gauss(0.0, 0.05), "cost": abs(params["x"])}


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> tuple[SearchResult, str]:
    db = f"sqlite:///{tmp_path_factory.mktemp('objective') / 'p.db'}"
    return proftune.search(noisy, SPACE, objectives=["loss:min"], trials=50, store=db, reevaluate=0.3), db


def test_plain_objective_is_searched_recorded_and_selected_by_its_mean(found: tuple[SearchResult, str]) -> None:
    result, db = found
    assert result.counts()["complete"] == 50  # repeats are inside the budget, not beside it
    repeats = [t for t in result.trials if t.repeat]
    assert repeats
    assert len(repeats) <= 0.3 * 50
    order = sorted(result.trials, key=lambda t: t.number)
    # the first 40% explore; the last 2 x 0.3 of the budget refine: repeats and neighbours of the leaders
    assert all(t.repeat == 0 and t.sampler != "neighbour" for t in order[:20])
    assert any(t.sampler == "neighbour" for t in order[20:])
    assert all(t.seed == t.repeat for t in result.trials)  # each repeat its own seed (search seed 0)
    sel = result.selection
    assert sel is not None
    assert sel.evaluations == 50
    assert sel.repeats == len(repeats)
    same = [t.values[0] for t in result.trials if t.params == sel.params and t.values]
    assert sel.n == len(same)
    assert sel.mean == pytest.approx(sum(same) / len(same))
    if sel.se is not None:
        assert sel.low == pytest.approx(sel.mean - 1.96 * sel.se)
        assert sel.low < sel.mean < sel.high
    assert result.best is not None
    assert result.best.params == sel.params
    assert set(result.best.metrics) == {"loss", "cost"}
    # the tune Run holds the record, and it reads back with its selection
    tune = proftune.Store(db).list_runs(kind="tune")[0]
    back = SearchResult.from_dict(proftune.Store(db).get_run(tune.id).result)
    assert back.selection == sel
    assert back.schema_version == 2


def test_a_number_is_the_metric_value_and_constraints_apply(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = proftune.search(lambda p: (p["x"] - 0.5) ** 2, SPACE, trials=6, store=db, reevaluate=0.0)
    assert res.objectives[0].text == "value:min"
    assert res.selection is None
    assert all(set(t.metrics) == {"value"} for t in res.trials)
    res = proftune.search(noisy, SPACE, objectives=["loss:min"], constraints=["cost<0.2"], trials=6, store=db,
                          reevaluate=0.0)
    assert all(t.state == ("complete" if t.metrics["cost"] < 0.2 else "infeasible") for t in res.trials)


def test_plain_objective_bad_input_is_one_error(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    with pytest.raises(ConfigError) as err:
        proftune.search(noisy, SPACE, objectives=["step_time_ms:min"], workers=2, reevaluate=1.5, store=db)
    text = str(err.value)
    assert "profile" in text
    assert "workers=2" in text
    assert "reevaluate=1.5" in text
    bad = proftune.search(lambda p: "bad", SPACE, trials=2, store=db)  # faults are data: failed trials
    assert [t.state for t in bad.trials] == ["failed", "failed"]
    assert "dict of metrics or a number" in (bad.trials[0].reason or "")


def test_user_sampler_and_pruner_instances(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    res = proftune.search(noisy, SPACE, objectives=["loss:min"], trials=5, store=db, reevaluate=0.0,
                          sampler=optuna.samplers.RandomSampler(seed=3), pruner=optuna.pruners.NopPruner())
    assert res.sampler == "RandomSampler"
    assert res.pruner == "NopPruner"
    assert {t.sampler for t in res.trials} == {"RandomSampler"}
    with pytest.raises(ConfigError, match="or an optuna BaseSampler"):
        proftune.search(noisy, SPACE, objectives=["loss:min"], sampler=object(), store=db)


def test_the_task_path_keeps_its_default_no_repeats() -> None:
    from proftune.search import SearchConfig

    assert SearchConfig().reevaluate is None  # None: 0.25 for a plain objective, 0 for a Task


def test_version_1_record_reads_without_selection(found: tuple[SearchResult, str]) -> None:
    d = found[0].to_dict(trials=False)
    d.pop("selection")
    d["schema_version"] = 1
    for t in [d["best"], *d["pareto"]]:
        t.pop("repeat")
        t.pop("seed")
    old = SearchResult.from_dict(d)
    assert old.selection is None
    assert old.best is not None
    assert old.best.repeat == 0


def test_rule_repeats_close_leaders_and_not_a_clear_winner() -> None:
    close = [Group({"x": 1}, (1.0, 1.2)), Group({"x": 2}, (1.05,)), Group({"x": 3}, (5.0,))]
    assert next_repeat(close, maximize=False, repeats=0, evaluations=4, share=0.3) == {"x": 2}  # no budget: now
    assert next_repeat(close, maximize=False, repeats=0, evaluations=40, budget=60, share=0.3) is None  # exploring
    assert next_repeat(close, maximize=False, repeats=0, evaluations=42, budget=60, share=0.3) == {"x": 2}  # its end
    assert next_repeat(close, maximize=False, repeats=0, evaluations=18, budget=20, share=0.3) is None  # too few
    clear = [Group({"x": 1}, (1.0, 1.02)), Group({"x": 2}, (3.0,)), Group({"x": 3}, (5.0,))]
    assert next_repeat(clear, maximize=False, repeats=0, evaluations=50, budget=60, share=0.3) is None
    assert next_repeat(close, maximize=False, repeats=18, evaluations=59, budget=60, share=0.3) is None  # spent
    # a lucky single draw is not named over a mean that held up, unless it is ahead beyond noise
    lucky = [Group({"x": 1}, (1.0, 1.1, 0.9, 1.0)), Group({"x": 2}, (0.98,))]
    assert pick(lucky, maximize=False).params == {"x": 1}  # type: ignore[union-attr]
    far = [Group({"x": 1}, (1.0, 1.1, 0.9, 1.0)), Group({"x": 2}, (0.2,))]
    assert pick(far, maximize=False).params == {"x": 2}  # type: ignore[union-attr]
    sel = select([({"x": 1}, 1.0), ({"x": 1}, 2.0), ({"x": 2}, 3.0)], maximize=False, repeats=1, share=0.3)
    assert sel is not None
    assert sel.mean == 1.5
    assert sel.n == 2
    assert sel.se == pytest.approx(0.5 ** 0.5 / 2 ** 0.5)
    assert [g.n for g in groups([({"x": 1, "y": "a"}, 1.0), ({"y": "a", "x": 1}, 2.0)])] == [2]


def test_the_study_report_names_the_best_by_its_mean_with_its_interval(found: tuple[SearchResult, str]) -> None:
    from proftune.report import render_report
    from proftune.report._html import fmt_number

    result, db = found
    sel = result.selection
    assert sel is not None
    assert sel.neighbours == sum(1 for t in result.trials if t.sampler == "neighbour") > 0
    html = render_report(study=result.study, store=db)
    assert f"loss {fmt_number(sel.mean)} over {sel.n} evaluation(s)" in html
    if sel.se is not None:
        assert f"95% interval [{fmt_number(sel.low)}, {fmt_number(sel.high)}]" in html
    told = f"{sel.repeats} of {sel.evaluations} trials re-evaluated leaders, {sel.neighbours} tried their neighbours"
    assert told in html
