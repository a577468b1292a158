"""TensorBoard: a run's scalars, histograms, text and hparams read back with EventAccumulator."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from proftune import Monitor, fit
from proftune.report import TensorBoardLogger, export_tensorboard
from proftune.track import Store

pytest.importorskip("tensorboard", reason="the tensorboard extra: pip install -e '.[tensorboard]'")
from tensorboard.backend.event_processing.event_accumulator import (
    EventAccumulator,
)

SIZES = {"scalars": 0, "histograms": 0, "tensors": 0}


def _read(folder: Path) -> EventAccumulator:
    ea = EventAccumulator(str(folder), size_guidance=SIZES)
    ea.Reload()
    return ea


def test_train_run_scalars_and_hparams(store: Store, runs: dict[str, int], tmp_path: Path) -> None:
    record = store.get_run(runs["train"])
    export_tensorboard(record.id, tmp_path / "tb", store=store)
    ea = _read(tmp_path / "tb")
    tags = ea.Tags()
    assert {"step/loss", "step/lr", "epoch/accuracy", "epoch/val_loss", "final/accuracy"} <= set(tags["scalars"])
    loss = ea.Scalars("step/loss")
    assert [e.step for e in loss] == [p["step"] for p in record.curves["step"]]
    assert loss[0].value == pytest.approx(record.curves["step"][0]["loss"])
    acc = ea.Scalars("epoch/accuracy")
    assert acc[-1].value == pytest.approx(record.metrics["accuracy"])
    plugins = ea.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in plugins
    start = plugins["_hparams_/session_start_info"]
    assert b"batch_size" in start
    assert b"optimizer" in start
    assert "run/overview/text_summary" in tags["tensors"]


def test_profile_histograms_and_tables(store: Store, runs: dict[str, int], tmp_path: Path) -> None:
    record = store.get_run(runs["profile"])
    export_tensorboard(record, tmp_path / "tb")
    ea = _read(tmp_path / "tb")
    layer = record.result["layers"][0]
    hist = ea.Histograms(f"activations/{layer['name']}")[0].histogram_value
    act = layer["stats"]["activation"]
    assert hist.num == act["numel"]
    assert hist.min == pytest.approx(act["min"])
    assert hist.max == pytest.approx(act["max"])
    assert hist.bucket_limit[1] == pytest.approx(act["p50"])
    assert f"weights/{layer['name']}" in ea.Tags()["histograms"]
    assert f"gradients/norm/{layer['name']}" in ea.Tags()["scalars"]
    table = ea.Tensors("profile/layers/text_summary")[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| name | type |")
    assert layer["type"] in table


def test_logger_in_fit_and_in_monitor(tmp_path: Path) -> None:
    result = fit("digits-mlp", {"batch_size": 128}, epochs=1, max_steps=4, device="cpu",
                 callbacks=[TensorBoardLogger(tmp_path / "fit", every=2)])
    ea = _read(tmp_path / "fit")
    assert [e.step for e in ea.Scalars("step/loss")] == [2, 4]
    assert [e.step for e in ea.Scalars("step/grad_norm")] == [2, 4]
    assert ea.Scalars("epoch/accuracy")[0].value == pytest.approx(result.metrics["accuracy"])

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Monitor(model, opt, every=100, callbacks=[TensorBoardLogger(tmp_path / "mon")]) as mon:
        for _ in range(3):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
    ea = _read(tmp_path / "mon")
    assert [e.step for e in ea.Scalars("step/loss")] == [1, 2, 3]
    assert ea.Scalars("step/lr")[0].value == pytest.approx(0.1)
