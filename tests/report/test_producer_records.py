"""The compress and predict pages rendered from what their producers record now (a real
``proftune.compress`` and ``proftune.predict`` of a tiny task, seconds), not from a frozen JSON:
a field a producer renames fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import proftune
from proftune.compress import CompressResult
from proftune.exceptions import ConfigError
from proftune.report import render_report
from proftune.track import Store

FAST = {"latency_rounds": 1, "finetune_epochs": 0, "layer_times": False, "params": {"hidden": 32},
        "sensitivity": False}


def _sections(html: str) -> list[str]:
    return re.findall(r"<section id=\"[^\"]+\"><h2>(.*?)</h2>", html)


def _charts(html: str) -> list[dict[str, Any]]:
    return [json.loads(m) for m in re.findall(r'<script type="application/json" data-chart="[^"]+">(.*?)</script>',
                                              html, re.S)]


@pytest.fixture(scope="module")
def compressed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, CompressResult]:
    db = f"sqlite:///{tmp_path_factory.mktemp('store') / 'proftune.db'}"
    model = proftune.fit("digits-mlp", {"hidden": 32}, epochs=1, seed=0, device="cpu").model.eval()
    path = tmp_path_factory.mktemp("orig") / "original.pt"
    torch.save(model.state_dict(), path)
    report = proftune.compress("digits-mlp", model=str(path), prune="structured", ratios=(0.5,),
                               quantize="dynamic", max_accuracy_drop=1.0, goal="size", device="cpu",
                               out=str(path.with_name("small.pt")), store=db, **FAST)
    return db, report


def test_compress_page_renders_the_recorded_record(compressed: tuple[str, CompressResult]) -> None:
    db, report = compressed
    store = Store(db)
    html = render_report(report.run_id, store=store)
    assert _sections(html) == ["Overview", "Candidates", "Plan and notes"]
    scatter = _charts(html)[0]
    xs = {x for trace in scatter["data"] for x in trace["x"]}  # the selected one is also on the front
    assert xs == {c.latency_ms for c in [report.baseline, *report.candidates]}
    for c in report.candidates:
        assert f"{c.metric:.4g}"[:4] in html
    assert report.selected is not None
    assert report.load_line is not None
    assert report.load_line.split("(")[0] in html


def test_compress_record_round_trips_through_its_run(compressed: tuple[str, CompressResult]) -> None:
    db, report = compressed
    stored = Store(db).get_run(report.run_id).result
    assert stored is not None
    assert stored["schema_version"] == report.schema_version == 1
    again = CompressResult.from_dict(stored)
    assert again.candidates == [dataclass_without_path(c) for c in report.candidates]
    assert again.selected == dataclass_without_path(report.selected)
    assert again.load_line == report.load_line
    assert CompressResult.from_dict(json.loads(json.dumps(again.to_dict()))).to_dict() == again.to_dict()
    with pytest.raises(AttributeError):
        report.notes = []  # type: ignore[misc]  # a frozen record
    renamed = {**stored, "baseline": {k if k != "latency_ms" else "latency" : v
                                      for k, v in stored["baseline"].items()}}
    with pytest.raises(TypeError, match="latency_ms"):
        CompressResult.from_dict(renamed)  # a renamed field fails, it does not render as blank
    with pytest.raises(ConfigError, match="newer"):
        CompressResult.from_dict({**stored, "schema_version": 99})


def dataclass_without_path(c: Any) -> Any:
    import dataclasses

    return None if c is None else dataclasses.replace(c, path=None)


def test_predict_page_renders_the_recorded_record(db_url: str) -> None:
    r = proftune.predict("digits-cnn", batch_size=16, target="a100", device="cpu", store=db_url)
    html = render_report(r.run_id, store=Store(db_url))
    assert _sections(html) == ["Overview", "Prediction", "Memory (predicted)", "Step time (roofline estimate)",
                               "Layers (predicted)"]
    bars = _charts(html)[0]["data"][0]
    assert bars["x"] == ["params", "buffers", "grads", "optimizer state", "batch", "activations"]
    assert bars["y"][0] == pytest.approx(r.memory.params_bytes / 2**20)
    assert bars["y"][-1] == pytest.approx(r.memory.activations_bytes / 2**20)
    assert r.peak.phase in html
    for lay in r.layers:
        assert f">{lay.type}<" in html


def test_predict_page_shows_one_gpus_memory_under_a_strategy(db_url: str) -> None:
    r = proftune.predict("digits-cnn", batch_size=16, target="a100", device="cpu", gpus=4, strategy="zero3",
                         store=db_url)
    p = r.parallel
    assert p is not None
    html = render_report(r.run_id, store=Store(db_url))
    assert _sections(html)[-1] == "Per GPU: ZeRO-3 on 4 GPUs (1 node), checkpointing none, offload none"
    bars = _charts(html)[-1]["data"][0]
    # ZeRO-3's gradients at its backward peak: the units in flight, not yet reduce-scattered
    assert bars["x"][:3] == ["params", "unsharded_grads", "optimizer_state"]
    assert bars["y"] == pytest.approx([p.memory[k] / 2**20 for k in bars["x"]])
    assert sum(bars["y"]) == pytest.approx(p.peak_bytes / 2**20)
    for c in p.collectives:
        assert c["name"] in html
    assert p.deepspeed["formula"] in html


def test_predict_page_ranks_the_plan_with_each_options_per_gpu_memory(db_url: str) -> None:
    bert = f"{Path(__file__).parents[1] / 'predict' / 'hf_tasks.py'}:TinyBert"
    ddp = proftune.predict(bert, batch_size=1, target="a100", gpus=4, strategy="ddp", max_batch=False)
    assert ddp.parallel is not None
    r = proftune.predict(bert, target="a100", device_memory=ddp.parallel.peak_bytes - 1, gpus=4, plan=True,
                         global_batch=32, store=db_url)
    plan = r.plan
    assert plan is not None
    assert plan.options
    assert plan.rejected
    html = render_report(r.run_id, store=Store(db_url))
    assert _sections(html)[-1] == "Plan: 4 GPUs, global batch 32"
    stacked = _charts(html)[-1]
    assert stacked["layout"]["barmode"] == "stack"
    strategies = list(dict.fromkeys(o.strategy for o in plan.options))
    assert len(stacked["data"][0]["x"]) == len(strategies)
    # each bar is the fastest option of its strategy; its stacked kinds add up to its per-GPU peak
    for i, s in enumerate(strategies):
        best = next(o for o in plan.options if o.strategy == s)
        assert sum(trace["y"][i] for trace in stacked["data"]) == pytest.approx(best.peak_bytes / 2**20)
    table = html.split("options that fit, fastest first (per GPU)")[1].split("</table>")[0]
    assert table.count("<tr") == len(plan.options) + 1  # the header and one row per option
    assert "DDP does not fit: needs" in html
