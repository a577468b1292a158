"""Measuring a candidate as it is saved: its counts, its size on disk and how fast it runs.

Saving and loading live in ``_checkpoint`` (no code from a file runs while it loads).
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._device import call_model, clock, move_to_device

__all__ = [
    "LatencyInput",
    "count",
    "file_size",
    "measure_latencies",
    "sparse_size_bytes",
]


def count(model: nn.Module, example: Any) -> tuple[int, int]:
    """``(params, macs)`` of a float model, from the profiler's one counter."""
    from ..profile import count_model

    counts = count_model(model, example)
    return int(counts.params_total), int(counts.macs)


def sparse_size_bytes(model: nn.Module) -> int:
    """Serialised size of the state dict with every mostly-zero weight stored as CSR.

    A weight goes sparse only where that is smaller than dense; the figure is what a sparse
    checkpoint takes on disk. Kernels for dense tensors get no speedup from zeros.
    """
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu()
        if t.is_floating_point() and t.dim() >= 2 and t.numel() > 0:
            flat = t.reshape(t.shape[0], -1)
            with warnings.catch_warnings():  # "CSR support is in beta": noise for a size figure
                warnings.simplefilter("ignore", UserWarning)
                csr = flat.to_sparse_csr()
            sparse_bytes = sum(x.numel() * x.element_size()
                               for x in (csr.values(), csr.col_indices(), csr.crow_indices()))
            if sparse_bytes < t.numel() * t.element_size():
                state[name] = csr
                continue
        state[name] = t
    buf = io.BytesIO()
    torch.save(state, buf)
    return len(buf.getvalue())


@contextlib.contextmanager
def fixed_threads(threads: int | None) -> Iterator[int]:
    """Run with ``threads`` intra-op threads (restored afterwards)."""
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


@dataclass
class LatencyInput:
    """An input of a given batch size for the latency runs."""

    batch_size: int
    example: Any


def measure_latencies(
    models: dict[str, Any],
    inputs: Sequence[LatencyInput],
    *,
    device: torch.device,
    threads: int | None = 1,
    warmup: int = 3,
    rounds: int = 5,
    min_repeats: int = 3,
    budget_s: float = 0.25,
    flush_denormal: bool = True,
) -> dict[str, dict[int, float]]:
    """Median milliseconds of one forward of each model at each batch size.

    Models run in interleaved rounds (each round times every model) so that a burst of load on
    a shared machine hits all candidates alike; each round repeats a model up to ``budget_s``
    (at least ``min_repeats``) after ``warmup`` untimed runs; the median over all is reported.
    """
    samples: dict[str, dict[int, list[float]]] = {k: {i.batch_size: [] for i in inputs} for k in models}
    placed = {i.batch_size: move_to_device(i.example, device) for i in inputs}
    with fixed_threads(threads if device.type == "cpu" else None), torch.inference_mode(), \
            flushed_denormals(flush_denormal and device.type == "cpu"):
        for model in models.values():
            for x in placed.values():
                for _ in range(warmup):
                    call_model(model, x)
        for _ in range(rounds):
            for name, model in models.items():
                for bs, x in placed.items():
                    spent = 0.0
                    n = 0
                    while n < min_repeats or spent < budget_s / rounds:
                        t0 = clock(device)
                        call_model(model, x)
                        dt = clock(device) - t0
                        samples[name][bs].append(dt * 1e3)
                        spent += dt
                        n += 1
                        if n >= 200:
                            break
    return {k: {bs: statistics.median(v) for bs, v in per.items()} for k, per in samples.items()}


def file_size(path: str | Path) -> int:
    """Bytes on disk."""
    return os.path.getsize(path)


def task_latencies(task: Any, model: nn.Module, batch_sizes: Sequence[int], *, device: torch.device,
                   rounds: int = 5) -> dict[int, float]:
    """Median ms of one forward of ``model`` at each batch size, on the inputs the task's loss feeds
    it (tensors, tuples or dicts) from its validation data; eval mode, one thread on CPU."""
    from ._pipeline import capture_inputs, slice_batch

    model = model.to(device).eval()
    batch = move_to_device(next(iter(task.val_data(max(batch_sizes)))), device)
    example = capture_inputs(task.loss, model, batch)
    inputs = [LatencyInput(b, slice_batch(example, b)) for b in sorted(set(batch_sizes))]
    return measure_latencies({"m": model}, inputs, device=device, rounds=rounds)["m"]
