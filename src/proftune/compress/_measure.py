"""Measuring a candidate as it is saved: the file, its size, how it reloads and how fast it runs.

Formats (one documented line to load each, :func:`load_model` picks by the file's content):

- ``torch.load(path, weights_only=False)``: float models (baseline, pruned), the whole module.
- ``torch.jit.load(path)``: ``torch.ao.quantization`` INT8 models (TorchScript; quantized FX
  graph modules do not survive pickling).
- ``torch.export.load(open(path, 'rb')).module()``: torchao INT8 models (tensor subclasses;
  an ExportedProgram; it has no ``.eval()``, it is already in inference form).
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._device import clock, move_to_device
from ..exceptions import ConfigError

__all__ = [
    "FORMATS",
    "LOAD_LINES",
    "count",
    "load_model",
    "measure_latencies",
    "save_model",
    "sparse_size_bytes",
]

FORMATS = ("pickle", "torchscript", "export")
LOAD_LINES = {
    "pickle": "torch.load({path!r}, weights_only=False)",
    "torchscript": "torch.jit.load({path!r})",
    "export": "torch.export.load(open({path!r}, 'rb')).module()",
}


def call(model: Any, example: Any) -> Any:
    """``model(example)`` for a tensor, ``model(*example)`` for a tuple, ``model(**example)`` for a dict."""
    if isinstance(example, dict):
        return model(**example)
    if isinstance(example, (tuple, list)):
        return model(*example)
    return model(example)


def _as_tuple(example: Any) -> tuple[Any, ...]:
    return tuple(example) if isinstance(example, (tuple, list)) else (example,)


def save_model(model: nn.Module, path: str | Path, example: Any, *, fmt: str) -> None:
    """Write ``model`` to ``path`` in ``fmt`` (see the module doc); the parent folder must exist."""
    path = Path(path)
    if fmt == "pickle":
        torch.save(model, path)
    elif fmt == "torchscript":
        with torch.no_grad():
            scripted = torch.jit.trace(model, _as_tuple(example), check_trace=False)
        torch.jit.save(scripted, str(path))
    elif fmt == "export":
        args = _as_tuple(example)
        batch = torch.export.Dim.DYNAMIC
        shapes = tuple({0: batch} if isinstance(a, torch.Tensor) and a.dim() > 0 else None for a in args)
        program = torch.export.export(model, args, dynamic_shapes=shapes)
        with open(path, "wb") as f:  # a file object: any suffix (torch.export wants .pt2 for a path)
            torch.export.save(program, f)
    else:
        raise ConfigError(f"fmt={fmt!r} is unknown; valid: {', '.join(FORMATS)}.")


def file_format(path: str | Path) -> str:
    """Which of :data:`FORMATS` a saved file is, from the archive's entries."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
    if any(n.endswith("serialized_exported_program.json") or "/models/" in n for n in names):
        return "export"
    if any(n.endswith("constants.pkl") for n in names) and any("/code/" in n for n in names):
        return "torchscript"
    return "pickle"


def load_model(path: str | Path) -> Any:
    """Load a model saved by ``proftune compress`` (any of its formats), ready for inference."""
    fmt = file_format(path)
    if fmt == "torchscript":
        return torch.jit.load(str(path), map_location="cpu")
    if fmt == "export":
        with open(path, "rb") as f:
            return torch.export.load(f).module()
    model = torch.load(path, weights_only=False, map_location="cpu")
    return model.eval() if isinstance(model, nn.Module) else model


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
                    call(model, x)
        for _ in range(rounds):
            for name, model in models.items():
                for bs, x in placed.items():
                    spent = 0.0
                    n = 0
                    while n < min_repeats or spent < budget_s / rounds:
                        t0 = clock(device)
                        call(model, x)
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
