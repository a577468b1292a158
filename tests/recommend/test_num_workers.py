"""The data loader's num_workers is measured on training steps where the task's loader is a DataLoader."""

from __future__ import annotations

import time
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

import proftune
from proftune.recommend._api import _measured_workers
from proftune.recommend._rules import Recommendation
from proftune.recommend._workers import measure_num_workers, num_workers_row, rebuilt


class _SlowRows(Dataset):
    """Each sample costs 1 ms of waiting (a decode from disk, say): loader workers hide it."""

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001)
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), torch.tensor(i % 2)


class _Stream(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(64):
            yield torch.randn(8), torch.tensor(i % 2)


class _LoaderTask(proftune.Task):
    name = "slow-loader"
    default_params: ClassVar[dict[str, Any]] = {"batch_size": 16, "lr": 0.01}
    dataset: Any = _SlowRows()
    workers = 0

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Linear(8, 2)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Any:
        return DataLoader(self.dataset, batch_size=batch_size, shuffle=False, num_workers=self.workers)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    def val_data(self, batch_size: int) -> Any:
        return DataLoader(self.dataset, batch_size=batch_size)

    def evaluate(self, model: nn.Module, batches: Any) -> dict[str, float]:
        return {"loss": 0.0}


def test_loader_workers_that_hide_a_slow_dataset_are_measured_and_chosen() -> None:
    task = _LoaderTask()
    w = measure_num_workers(task, proftune.TrainParams.of(task), 16, threads=1, device=torch.device("cpu"),
                            candidates=[0, 2])
    # 16 samples x 1 ms of waiting per batch in the training process; two workers wait for it meanwhile
    assert w.step_ms[0] > 1.5 * w.step_ms[2], w.step_ms
    assert w.data_ms[0] > w.data_ms[2]
    assert w.chosen == 2
    assert w.task_workers == 0
    assert len(w.samples[0]) == w.rounds * (w.steps - 2)


def test_the_row_names_each_count_and_the_tasks_value() -> None:
    task = _LoaderTask()
    row = num_workers_row(task, proftune.TrainParams.of(task), 16, threads=1, device=torch.device("cpu"))
    assert row is not None
    assert row.name == "num_workers"
    assert row.value == min(int(c) for c, v in row.evidence["step_ms"].items()
                            if v <= min(row.evidence["step_ms"].values()) * 1.1)
    assert set(row.evidence["step_ms"]) >= {"0", "1"}
    assert row.evidence["task_num_workers"] == 0
    assert "num_workers 0:" in row.reason
    assert "the task sets 0" in row.reason
    advice = Recommendation("data_loading", {"num_workers": 7, "pin_memory": False}, "DataLoader(num_workers=7, x)")
    merged = _measured_workers(advice, row)
    assert merged.value["num_workers"] == row.value
    assert f"num_workers={row.value}" in merged.reason


def test_a_loader_keeps_its_sampler_and_collate_when_rebuilt() -> None:
    def collate(rows: list[Any]) -> Any:
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])

    loader = DataLoader(list(zip(torch.arange(10.0), torch.arange(10), strict=True)),
                        batch_size=4, drop_last=True,
                        collate_fn=collate)
    again = rebuilt(loader, 0)
    assert [b[1].tolist() for b in again] == [b[1].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_no_dataloader_no_row_and_a_stream_is_not_measured() -> None:
    assert num_workers_row(proftune.task.load_task("digits-mlp"), proftune.TrainParams(), 32, threads=1,
                           device=torch.device("cpu")) is None
    task = _LoaderTask()
    task.dataset = _Stream()
    row = num_workers_row(task, proftune.TrainParams.of(task), 16, threads=1, device=torch.device("cpu"))
    assert row is not None
    assert row.value is None
    assert "IterableDataset" in row.reason


def test_measuring_refuses_a_task_without_a_loader() -> None:
    with pytest.raises(TypeError, match="not a DataLoader"):
        measure_num_workers(proftune.task.load_task("digits-mlp"), proftune.TrainParams(), 32, threads=1,
                            device=torch.device("cpu"))


@pytest.mark.slow
def test_recommend_has_a_measured_num_workers_row_for_a_loader_task(db_url: str) -> None:
    recs = proftune.recommend(_LoaderTask(), device="cpu", lr_steps=20, noise_steps=4, store=db_url)
    by = {r.name: r for r in recs}
    assert list(by)[-1] == "num_workers"
    assert by["num_workers"].value in (1, 2)  # the 1 ms-per-sample dataset: workers hide it
    assert by["threads"].evidence["num_workers_note"].startswith("the task's own value")
    run = proftune.track.Store(db_url).get_run(recs.run_id)
    assert [r["name"] for r in run.result["recommendations"]][-1] == "num_workers"


def test_the_threads_row_reads_the_fit_loops_count_where_asked_not_to_measure_again() -> None:
    """``measure=False`` (the optimize loop's compute stage, after the baseline's training): the
    count the last fit of the task measured, not a second measurement (a slow model's took 3 s of a
    15 s budget); none remembered: measured as before."""
    from proftune import _threads
    from proftune.recommend._api import _threads_row
    from proftune.train import fit

    task = proftune.task.load_task("digits-mlp")
    cpu = torch.device("cpu")
    _threads.forget()
    fresh = _threads_row(task, proftune.TrainParams.of(task), 32, device=cpu, seed=0, measure=False)
    assert fresh.evidence["source"] != "remembered"  # nothing remembered: measured
    assert fresh.evidence["steps"] > 0
    fit(task, {}, max_steps=12, device=cpu, seed=0, evaluate=False)
    remembered = _threads.recall(_threads.fit_key(task, "cpu"))
    assert remembered is not None
    row = _threads_row(task, proftune.TrainParams.of(task), 32, device=cpu, seed=0, measure=False)
    assert row.evidence["source"] == "remembered"
    assert row.value == remembered[0]
    assert row.evidence["num_workers"] is None  # the loader's evidence as a measured row gives it
    assert _threads_row(task, proftune.TrainParams.of(task), 32, device=cpu, seed=0).evidence["source"] != "remembered"
