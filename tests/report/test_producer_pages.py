"""The profile, train, trial, batch_size, lr_find and recommend pages rendered from what their
producers record now (real runs of digits-mlp and wine-mlp, seconds each, shared by the module),
not from a frozen JSON: each page reads its Run through the producer's record, so a field a
producer renames fails here instead of rendering as a blank."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

import proftune
from proftune import TrainResult
from proftune._jsonsafe import json_dumps
from proftune.exceptions import ConfigError
from proftune.profile import Profile
from proftune.recommend import (
    BatchSizeResult,
    LRFindResult,
    Recommendations,
    find_batch_size,
    lr_find,
    recommend,
)
from proftune.report import render_report
from proftune.report._html import esc, fmt_number, fmt_value
from proftune.search import SearchResult, TrialResult
from proftune.track import Store

SPACE: dict[str, Any] = {"params": {"hidden": {"type": "int", "low": 8, "high": 256, "step": 8},
                                    "lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True}}}


@dataclasses.dataclass(frozen=True)
class Recorded:
    """One store holding a real run of each kind, and what each producer returned."""

    store: Store
    profile: Profile
    train: TrainResult
    batch: BatchSizeResult
    lr: LRFindResult
    recs: Recommendations
    search: SearchResult


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    db = f"sqlite:///{tmp_path_factory.mktemp('store') / 'runs.db'}"
    prof = proftune.profile("digits-mlp", batch_size=32, steps=2, warmup=1, device="cpu", store=db)
    train = proftune.run_train("wine-mlp", epochs=2, seed=0, device="cpu", store=db)
    batch = find_batch_size("digits-mlp", memory_budget="64MiB", device="cpu", profile=prof, store=db)
    lr = lr_find("digits-mlp", steps=20, device="cpu", store=db)
    recs = recommend("digits-mlp", profile=prof, memory_budget="64MiB", device="cpu", lr_steps=20, noise_steps=5,
                     optimizer_budget_s=0, embedding_budget_s=0, store=db)
    # one trial that trains (8 hidden units) and one the gate stops before training (256: params > 3000)
    search = proftune.search("wine-mlp", SPACE, constraints=["params<3000"], trials=2, max_steps=2, epochs=1,
                             device="cpu", store=db, scan=0,
                             enqueue=[{"params": {"hidden": 8, "lr": 0.01}}, {"params": {"hidden": 256, "lr": 0.01}}])
    return Recorded(Store(db), prof, train, batch, lr, recs, search)


def _sections(html: str) -> list[str]:
    return re.findall(r"<section id=\"[^\"]+\"><h2>(.*?)</h2>", html)


def _charts(html: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in re.findall(r'<script type="application/json" data-chart="[^"]+">(.*?)</script>',
                                              html, re.S)]


def _kv(label: str, value: Any) -> str:
    """A row of a key-value table as the page writes it."""
    return f"<tr><th>{esc(label)}</th><td>{esc(value if isinstance(value, str) else fmt_value(label, value))}</td></tr>"


def _table(html: str, title: str) -> list[list[str]]:
    """The cells' texts of the table titled ``title``, row by row."""
    body = html.split(f"<h3>{esc(title)}</h3>", 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>.*?</td>", row)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)]


def _run_id(rec: Profile) -> int:
    rid = rec.config["run_id"]
    assert isinstance(rid, int)
    return rid


# -- the pages --------------------------------------------------------------------------------------


def test_profile_page_shows_the_recorded_profile(recorded: Recorded) -> None:
    p = recorded.profile
    html = render_report(_run_id(p), store=recorded.store)
    assert _sections(html) == ["Overview", "Profile", "Step breakdown", "Memory", "Layers", "Statistics per layer",
                               "Bottlenecks", "By layer type"]
    assert _kv("params (total)", p.params.total) in html
    assert _kv("peak_memory_bytes", p.memory.peak_bytes) in html
    steps, memory, layers = (next(c for c in _charts(html) if c["layout"]["title"]["text"].startswith(t))
                             for t in ("where a step", "memory of a training step", "share of time"))
    assert [t["x"][0] for t in steps["data"]] == pytest.approx(
        [p.step.data_ms, p.step.forward_ms, p.step.backward_ms, p.step.optimizer_ms, p.step.other_ms])
    assert memory["data"][0]["y"] == pytest.approx([p.memory.params_bytes / 2**20, p.memory.grads_bytes / 2**20,
                                                    p.memory.optimizer_bytes / 2**20,
                                                    p.memory.activations_bytes / 2**20])
    assert {name.split(" · ")[0] for name in layers["data"][0]["y"]} == {lay.name or "(model)" for lay in p.layers}
    for b in p.bottlenecks:
        assert esc(b["finding"]) in html


def test_train_page_shows_the_recorded_fit(recorded: Recorded) -> None:
    t = recorded.train
    assert t.result is not None
    assert (t.epochs, t.steps, t.samples, t.metrics) == (2, t.result.steps, t.result.samples, t.result.metrics)
    html = render_report(t.run_id, store=recorded.store)
    assert _sections(html) == ["Overview", "Training", "Curves"]
    for label, value in (("epochs", 2), ("steps", t.steps), ("samples", t.samples), ("throughput", t.throughput)):
        assert _kv(label, value) in html
    epochs = next(c for c in _charts(html) if c["layout"]["title"]["text"] == "loss per epoch")
    assert epochs["data"][0]["x"] == [1, 2]


def test_trial_pages_show_how_each_trial_ended(recorded: Recorded) -> None:
    by_number = {tr.number: tr for tr in recorded.search.trials}  # the search's own view, from Optuna's storage
    assert {tr.state for tr in by_number.values()} == {"complete", "infeasible"}
    for run in recorded.store.list_runs(kind="trial", study=recorded.search.study):
        tr = by_number[run.config["trial"]]
        html = render_report(run.id, store=recorded.store)
        assert _sections(html) == ["Overview", "Trial", *(["Curves"] if tr.steps else [])]
        assert _kv("state", tr.state) in html
        assert _kv("steps", tr.steps) in html
        assert _kv("reason", tr.reason or "-") in html
        measured = tr.constraints["params<3000"].value
        assert _table(html, "constraints") == [["params&lt;3000", "params", fmt_number(measured), "3,000",
                                                "yes" if tr.state == "complete" else "NO"]]


def test_batch_size_page_shows_every_probe(recorded: Recorded) -> None:
    b = recorded.batch
    assert b.probes[0].role == "profile"  # the profile's point joined the fit without a step
    html = render_report(b.run_id, store=recorded.store)
    assert _sections(html) == ["Overview", "Memory model"]
    fig = _charts(html)[0]
    probes = sorted(x for t in fig["data"] if t["name"].startswith("probe") for x in t["x"])
    assert probes == sorted(p.batch_size for p in b.probes)
    assert any(s.get("x0") == b.max_batch_size for s in fig["layout"]["shapes"])
    fitted = next(t for t in fig["data"] if t["name"].startswith("fitted"))
    assert fitted["y"][0] == pytest.approx(b.model.intercept_bytes / 2**20)
    assert _kv("max_batch_size", b.max_batch_size) in html
    assert _kv("measured steps", b.runs) in html
    assert [row[0] for row in _table(html, "probes")] == [fmt_number(p.batch_size) for p in b.probes]


def test_lr_find_page_shows_the_recorded_curve(recorded: Recorded) -> None:
    lr = recorded.lr
    html = render_report(lr.run_id, store=recorded.store)
    assert _sections(html) == ["Overview", "LR range test"]
    fig = _charts(html)[0]
    assert fig["data"][0]["x"] == pytest.approx(list(lr.lrs))
    if lr.suggested_lr is not None:
        assert any(s.get("x0") == pytest.approx(lr.suggested_lr) for s in fig["layout"]["shapes"])
    assert _kv("steps", lr.steps) in html
    assert _kv("optimizer", lr.optimizer) in html


def test_recommend_page_shows_the_cards_and_the_search(recorded: Recorded) -> None:
    recs = recorded.recs
    assert recs.run_id is not None
    html = render_report(recs.run_id, store=recorded.store)
    assert _sections(html) == ["Overview", "Recommendations", "Memory model"]
    assert re.findall(r'<div class="name">(.*?)</div>', html) == [r.name for r in recs]
    for r in recs:
        assert esc(r.reason) in html
    fig = _charts(html)[0]  # the batch-size search inside recommend, every probe of it
    search = BatchSizeResult.from_dict(recs.get("batch_size").evidence["search"])
    assert search.max_batch_size == recs.get("batch_size").evidence["max_batch_size"]
    probes = sorted(x for t in fig["data"] if t["name"].startswith("probe") for x in t["x"])
    assert probes == sorted(p.batch_size for p in search.probes)
    assert len(probes) >= 3


# -- the records ------------------------------------------------------------------------------------


def _stored(recorded: Recorded, kind: str) -> dict[str, Any]:
    run = recorded.store.list_runs(kind=kind)[0]
    assert run.result is not None
    return json.loads(json.dumps(run.result))


#: The record each kind's Run holds, what is compared after a round trip, and what the Run keeps apart.
KINDS = ("profile", "train", "batch_size", "lr_find", "recommend", "trial")


def _read(kind: str, d: dict[str, Any], recorded: Recorded) -> Any:
    if kind == "lr_find":  # the Run keeps the curve in its curves
        run = recorded.store.list_runs(kind="lr_find")[0]
        return LRFindResult.from_dict({**d, "curve": (run.curves or {})["lr_range"]})
    return {"profile": Profile, "train": TrainResult, "batch_size": BatchSizeResult, "recommend": Recommendations,
            "trial": TrialResult}[kind].from_dict(d)


@pytest.mark.parametrize("kind", KINDS)
def test_each_run_holds_its_record_and_reads_it_back(recorded: Recorded, kind: str) -> None:
    stored = _stored(recorded, kind)
    assert stored["schema_version"] == 1
    record = _read(kind, stored, recorded)
    again = json.loads(json_dumps(record.to_dict()))
    assert json_dumps(type(record).from_dict(again).to_dict()) == json_dumps(again)  # to_dict -> from_dict -> to_dict
    unversioned = _read(kind, {k: v for k, v in stored.items() if k != "schema_version"}, recorded)  # recorded before
    assert json_dumps(unversioned.to_dict()) == json_dumps(record.to_dict())
    assert unversioned.schema_version == 1
    with pytest.raises(ConfigError, match=r"schema_version=2, newer than this proftune reads \(schema_version 1\)"):
        _read(kind, {**stored, "schema_version": 2}, recorded)
    field = next(f.name for f in dataclasses.fields(record) if f.name != "schema_version")
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, field, None)


def test_the_records_equal_what_the_producers_returned(recorded: Recorded) -> None:
    # a bottleneck's excess can be inf, which JSON holds as null: compared as written
    assert (json_dumps(Profile.from_dict(_stored(recorded, "profile")).to_dict())
            == json_dumps(recorded.profile.to_dict()))
    assert TrainResult.from_dict(_stored(recorded, "train")) == recorded.train
    assert BatchSizeResult.from_dict(_stored(recorded, "batch_size")) == recorded.batch
    lr = _read("lr_find", _stored(recorded, "lr_find"), recorded)
    assert json_dumps(lr.to_dict()) == json_dumps(recorded.lr.to_dict())
    recs = Recommendations.from_dict(_stored(recorded, "recommend"))
    assert [r.name for r in recs] == [r.name for r in recorded.recs]
    assert recs.measured == json.loads(json.dumps(recorded.recs.measured))
    assert recs.run_id == recorded.recs.run_id


@pytest.mark.parametrize(("kind", "path", "new"), [
    ("profile", ("memory", "peak_bytes"), "peak"),
    ("train", ("samples",), "n_samples"),
    ("batch_size", ("probes", 0, "peak_bytes"), "peak"),
    ("lr_find", ("suggested_lr",), "lr_suggested"),
    ("recommend", ("recommendations", 0, "reason"), "why"),
    ("trial", ("train_s",), "train_seconds"),
])
def test_a_renamed_field_fails_the_page(recorded: Recorded, tmp_path: Path, kind: str, path: tuple[Any, ...],
                                        new: str) -> None:
    stored = _stored(recorded, kind)
    holder: Any = stored
    for key in path[:-1]:
        holder = holder[key]
    holder[new] = holder.pop(path[-1])
    with pytest.raises(ConfigError, match=rf"{new} is not a field"):
        _read(kind, stored, recorded)
    run = recorded.store.list_runs(kind=kind)[0]
    copy = Store(f"sqlite:///{tmp_path / 'renamed.db'}")
    rid = copy.start_run(kind, run.task, config=run.config)
    copy.update_run(rid, status="finished", result=stored, curves=run.curves)
    with pytest.raises(ConfigError, match=new):
        render_report(rid, store=copy)  # not a page with a blank where the number was
