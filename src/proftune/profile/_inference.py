"""The one producer of the two deployment figures of a model: ``latency_ms`` and ``size_bytes``.

The search gate, compress and optimize all call these functions, and the metric registry
(:mod:`proftune.metrics`) names them, so that a constraint ``latency_ms<2`` in ``tune`` and a
``--goal latency`` in ``compress`` measure the same thing.

``latency_ms`` (:func:`task_latencies`, :func:`time_forwards`): milliseconds of one forward pass
at batch 1, in eval mode under ``torch.inference_mode``, on the inputs the task's loss feeds the
model (the loss itself is not timed). After ``warmup`` untimed forwards, ``rounds`` interleaved
rounds each time every model at every batch size (a burst of load hits all models alike), each
model at least ``min_repeats`` times per round; the figure is the median of every timed forward.
On CPU the forwards run at ``threads`` intra-op threads (1 by default) with denormals flushed to
zero, and at one thread each forward is timed by the process's CPU time: another process can
delay a forward but cannot add to the CPU time it needs, so the figure does not follow the
machine's load (the wall clock is kept beside it). At several threads, or on CUDA (synchronised),
the wall clock is the figure.

``size_bytes`` (:func:`size_bytes`): bytes of the model as saved. A file's size when the model is
a file (a quantized, compiled or exported artifact); else the bytes ``torch.save`` writes for
the model's state dict (or for the given state dict), counted without keeping them (a file of
that state dict has exactly this size when named ``archive.pt``: torch names the records in it
after the file, a few bytes per tensor).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from .._device import call_model, capture_inputs, clock, move_to_device, slice_batch
from .._records import JsonRecord

__all__ = ["CPU_BASIS", "WALL_BASIS", "ForwardTiming", "size_bytes", "task_latencies", "time_forwards"]

#: How a forward is timed at one intra-op thread on CPU, and otherwise.
CPU_BASIS = "cpu time, 1 thread"
WALL_BASIS = "wall clock"
#: Timed forwards per model and batch size stop at this many, whatever the time budget.
MAX_REPEATS = 200


@dataclass(frozen=True)
class ForwardTiming(JsonRecord):
    """How long one forward took (``ms``, the median by ``basis``) and how it was measured."""

    DERIVED: ClassVar[tuple[str, ...]] = ("noise",)

    ms: float
    basis: str
    threads: int
    forwards: int
    wall_median_ms: float
    wall_min_ms: float
    cpu_median_ms: float

    @property
    def noise(self) -> float:
        """The wall clock's spread: median / fastest - 1 (0.05 on a quiet machine)."""
        return self.wall_median_ms / self.wall_min_ms - 1.0 if self.wall_min_ms > 0 else 0.0


@contextlib.contextmanager
def fixed_threads(threads: int | None) -> Iterator[int]:
    """Run with ``threads`` intra-op threads (restored afterwards); None keeps the process's."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def flushed_denormals(enabled: bool) -> Iterator[None]:
    """Flush denormal floats to zero on CPU while timing (torch has no getter; the default, off,
    is restored). Trained float models can produce denormal activations that run several times
    slower on x86 and would inflate every speedup measured against them."""
    if not enabled:
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def time_forwards(
    models: Mapping[str, Any],
    inputs: Mapping[int, Any],
    *,
    device: torch.device,
    threads: int | None = 1,
    warmup: int = 3,
    rounds: int = 5,
    min_repeats: int = 3,
    budget_s: float = 0.25,
    flush_denormal: bool = True,
) -> dict[str, dict[int, ForwardTiming]]:
    """One forward of each model (``{name: model}``) on each input (``{batch_size: inputs}``),
    timed as the module doc says: ``{name: {batch_size: ForwardTiming}}``.

    Each round spends up to ``budget_s / rounds`` seconds (at least ``min_repeats`` forwards) on
    each model at each batch size.
    """
    cpu = device.type == "cpu"
    wall: dict[str, dict[int, list[float]]] = {k: {b: [] for b in inputs} for k in models}
    used: dict[str, dict[int, list[float]]] = {k: {b: [] for b in inputs} for k in models}
    placed = {b: move_to_device(x, device) for b, x in inputs.items()}
    with fixed_threads(threads if cpu else None) as running, torch.inference_mode(), \
            flushed_denormals(flush_denormal and cpu):
        by_cpu = cpu and running == 1
        for model in models.values():
            for x in placed.values():
                for _ in range(warmup):
                    call_model(model, x)
        for _ in range(rounds):
            for name, model in models.items():
                for bs, x in placed.items():
                    spent, n = 0.0, 0
                    while (n < min_repeats or spent < budget_s / rounds) and n < MAX_REPEATS:
                        c0, t0 = time.process_time(), clock(device)
                        call_model(model, x)
                        dt = clock(device) - t0
                        wall[name][bs].append(dt * 1e3)
                        used[name][bs].append((time.process_time() - c0) * 1e3)
                        spent += dt
                        n += 1
    basis = CPU_BASIS if by_cpu else WALL_BASIS
    return {name: {bs: _timing(wall[name][bs], used[name][bs], basis=basis, threads=running)
                   for bs in inputs} for name in models}


def _timing(wall: list[float], cpu: list[float], *, basis: str, threads: int) -> ForwardTiming:
    wall_median, cpu_median = statistics.median(wall), statistics.median(cpu)
    return ForwardTiming(ms=cpu_median if basis == CPU_BASIS else wall_median, basis=basis, threads=threads,
                         forwards=len(wall), wall_median_ms=wall_median, wall_min_ms=min(wall),
                         cpu_median_ms=cpu_median)


def forward_inputs(task: Any, model: nn.Module, batch_sizes: Sequence[int], *,
                   device: torch.device) -> dict[int, Any]:
    """``{batch_size: inputs}``: what the task's loss feeds ``model`` (a tensor, a tuple or a dict)
    from its first validation batch, cut to each batch size."""
    batch = move_to_device(next(iter(task.val_data(max(batch_sizes)))), device)
    example = capture_inputs(task.loss, model, batch)
    return {b: slice_batch(example, b) for b in sorted(set(batch_sizes))}


def task_latencies(task: Any, model: nn.Module, batch_sizes: Sequence[int] = (1,), *,
                   device: torch.device, threads: int | None = 1, rounds: int = 5) -> dict[int, ForwardTiming]:
    """The forward of ``model`` in eval mode at each batch size (``latency_ms`` at batch 1) on the
    inputs the task's loss feeds it, timed by :func:`time_forwards`."""
    model = model.to(device).eval()
    inputs = forward_inputs(task, model, batch_sizes, device=device)
    return time_forwards({"m": model}, inputs, device=device, threads=threads, rounds=rounds)["m"]


class _Counter:
    """A write-only file that counts the bytes written to it and keeps none."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, data: bytes) -> int:
        self.n += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def size_bytes(model: nn.Module | Mapping[str, Any] | str | Path) -> int:
    """``size_bytes``: the file's size for a path, else the bytes ``torch.save`` writes for the
    state dict (of a module, or the mapping given)."""
    if isinstance(model, (str, Path)):
        return os.path.getsize(model)
    state = model.state_dict() if isinstance(model, nn.Module) else model  # keeps its _metadata
    sink = _Counter()
    torch.save(state, sink)  # type: ignore[arg-type]
    return sink.n
