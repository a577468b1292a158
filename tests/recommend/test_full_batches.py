from __future__ import annotations

import torch

import proftune
from proftune.recommend._full_batches import FullBatchTask, samples_per_epoch
from proftune.train import TrainParams


def test_batches_are_always_full_even_beyond_the_dataset() -> None:
    inner = proftune.load_task("digits-mlp")  # 1437 training samples
    task = FullBatchTask(inner)
    for size in (64, 1000, 3000):
        batches = list(task.train_data(size, {}))
        assert len(batches) >= 2
        assert {x.shape[0] for x, _ in batches} == {size}
        assert all(y.shape[0] == size and x.shape[1:] == (64,) for x, y in batches)
    model = task.build_model({})
    x, y = next(iter(task.train_data(8, {})))
    assert torch.isfinite(task.loss(model, (x, y)))
    assert samples_per_epoch(inner, TrainParams(), batch_size=512, stop_after=10_000) == 1437
