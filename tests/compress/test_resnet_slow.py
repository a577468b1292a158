"""ResNet-18 structured pruning at Torch-Pruning's published operating point (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import proftune


@pytest.mark.slow
def test_resnet18_structured_half_reaches_published_figures(tmp_path: Path, db_url: str) -> None:
    task = proftune.load_task("resnet18-synthetic")
    torch.manual_seed(0)
    model = task.build_model({}).eval()
    report = proftune.compress(task, model=model, prune="structured", ratios=(0.5,), round_to=8,
                               sensitivity=False, finetune_epochs=0, max_accuracy_drop=1.0, goal="macs",
                               out=str(tmp_path / "r18.pt"), db=db_url, latency_rounds=3)
    base, pruned = report.baseline, report.candidates[0]
    assert base.macs == pytest.approx(1.82e9, rel=0.01)
    assert base.params == pytest.approx(11.69e6, rel=0.01)
    assert pruned.macs <= 0.49e9
    assert pruned.params <= 3.1e6
    assert pruned.latency_ms < base.latency_ms
    from proftune.compress import load_model

    for m in load_model(tmp_path / "r18.pt").modules():
        if isinstance(m, torch.nn.Conv2d):
            assert m.out_channels % 8 == 0
