"""Measuring a candidate as it is saved: its counts and the size of a sparse checkpoint.

Its size as saved and its latency come from their one producer, :mod:`proftune.profile`
(``size_bytes``, ``time_forwards``). Saving and loading live in ``_checkpoint`` (no code from a
file runs while it loads).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from ..profile import size_bytes

__all__ = ["count", "sparse_size_bytes", "tensors_of"]


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
    return size_bytes(state)


def tensors_of(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value`` (a model's inputs or outputs: tuples, dicts, nested)."""
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(value)
    return [t for t in leaves if isinstance(t, torch.Tensor)]
