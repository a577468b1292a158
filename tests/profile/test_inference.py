"""latency_ms and size_bytes have one producer each (proftune.profile), which the search gate,
compress and optimize all call: the gate once timed the task's whole loss step for latency_ms and
summed the in-memory bytes for size_bytes, while compress timed the forward and read the file."""

from __future__ import annotations

import io
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from proftune import Task
from proftune.exceptions import ProblemCollector
from proftune.metrics import METRICS
from proftune.profile import (
    ForwardTiming,
    size_bytes,
    task_latencies,
    time_forwards,
)
from proftune.profile._inference import CPU_BASIS, WALL_BASIS
from proftune.search import ProfileGate, parse_constraint


def _heavy() -> torch.Tensor:
    """Work the task's loss does besides calling the model (a few 256x256 matmuls)."""
    w = torch.eye(256) + 0.01 * torch.ones(256, 256)
    for _ in range(12):
        w = torch.tanh(w @ w)
    return w.sum()


class HeavyLoss(Task):
    """A tiny linear model whose loss spends far more time than the model's forward."""

    name = "heavy-loss"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Linear(13, 3)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        return self.val_data(batch_size)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(batch_size, 13, generator=g), torch.randint(0, 3, (batch_size,), generator=g))]

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y) + 0.0 * _heavy()


def _cpu_ms_of_heavy() -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(3):
            c0 = time.process_time()
            _heavy()
            best = min(best, (time.process_time() - c0) * 1e3)
        return best
    finally:
        torch.set_num_threads(before)


def test_the_gate_times_the_forward_not_the_loss() -> None:
    """Before: the gate's latency_ms was the CPU time of an inference step through the task's
    loss (here dominated by the loss's own work); now it is the producer's forward."""
    c = parse_constraint("latency_ms<1e9", ProblemCollector())
    assert c is not None
    result = ProfileGate([c], device="cpu").check(HeavyLoss(), {})
    heavy = _cpu_ms_of_heavy()
    assert result.metrics["latency_ms"] > 0
    assert result.metrics["latency_ms"] < 0.1 * heavy, (result.metrics, heavy)
    timing = result.timing["inference"]
    assert timing["basis"] == CPU_BASIS
    assert timing["statistic"] == "median"
    assert timing["value_ms"] == result.metrics["latency_ms"]


def test_the_gate_size_is_the_state_dict_as_saved() -> None:
    """Before: the gate summed parameter and buffer bytes in memory (no file holds that many)."""
    c = parse_constraint("size_bytes<1e12", ProblemCollector())
    assert c is not None
    result = ProfileGate([c], device="cpu").check(HeavyLoss(), {})
    buf = io.BytesIO()
    torch.save(nn.Linear(13, 3).state_dict(), buf)
    assert result.metrics["size_bytes"] == len(buf.getvalue())
    in_memory = (13 * 3 + 3) * 4
    assert result.metrics["size_bytes"] > in_memory


def test_size_bytes_of_a_module_a_state_dict_and_a_file(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32))
    path = tmp_path / "archive.pt"  # torch.save names a file's records after its stem, a buffer's "archive"
    torch.save(model.state_dict(), path)
    assert size_bytes(model) == path.stat().st_size
    assert size_bytes(model.state_dict()) == path.stat().st_size
    assert size_bytes(path) == size_bytes(str(path)) == path.stat().st_size


def test_time_forwards_basis_follows_threads_and_device() -> None:
    model = nn.Linear(8, 4).eval()
    inputs = {1: torch.randn(1, 8), 4: torch.randn(4, 8)}
    one = time_forwards({"m": model}, inputs, device=torch.device("cpu"), threads=1, rounds=2)["m"]
    assert set(one) == {1, 4}
    t = one[1]
    assert isinstance(t, ForwardTiming)
    assert t.basis == CPU_BASIS
    assert t.threads == 1
    assert t.ms == t.cpu_median_ms
    assert t.forwards >= 2 * 3  # rounds x min_repeats
    assert t.wall_min_ms <= t.wall_median_ms
    two = time_forwards({"m": model}, {1: inputs[1]}, device=torch.device("cpu"), threads=2, rounds=1)["m"][1]
    assert two.basis == WALL_BASIS
    assert two.ms == two.wall_median_ms
    assert torch.get_num_threads() == torch.get_num_threads()  # restored (no error on exit)


def test_task_latencies_time_the_inputs_the_loss_feeds_even_a_dict() -> None:
    """A model called as model(features=..., scale=...) from a dict batch gets a latency per batch size."""

    class Keyed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(6, 2)

        def forward(self, features: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return self.lin(features) * scale

    class DictTask(Task):
        name = "dict-batches"

        def build_model(self, params: dict[str, Any]) -> nn.Module:
            return Keyed()

        def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
            return self.val_data(batch_size)

        def val_data(self, batch_size: int) -> Iterable[Any]:
            yield {"features": torch.randn(batch_size, 6), "scale": torch.ones(batch_size, 1),
                   "y": torch.zeros(batch_size, dtype=torch.long)}

        def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
            out = model(features=batch["features"], scale=batch["scale"])
            return nn.functional.cross_entropy(out, batch["y"])

        def evaluate(self, model: nn.Module, data: Iterable[Any]) -> dict[str, float]:
            return {"val_loss": 0.0}

    times = task_latencies(DictTask(), Keyed(), (1, 8), device=torch.device("cpu"), rounds=2)
    assert set(times) == {1, 8}
    assert all(0 < t.ms < 1000 for t in times.values())


@pytest.mark.parametrize("name", ["latency_ms", "size_bytes"])
def test_the_registry_names_the_producer(name: str) -> None:
    producer = METRICS[name].producer
    assert producer in ("proftune.profile.task_latencies", "proftune.profile.size_bytes")
    import proftune.profile as subpackage

    assert callable(getattr(subpackage, producer.rsplit(".", 1)[1]))
