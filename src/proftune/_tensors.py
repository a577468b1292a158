"""Norms over many tensors at once (one home for the global gradient norm)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

__all__ = ["global_grad_norm", "l2_norm"]


def l2_norm(tensors: Sequence[torch.Tensor]) -> float:
    """The L2 norm of ``tensors`` taken together (as if concatenated), in one host copy.

    0.0 for no tensors; NaN/Inf when any element is not finite (what a caller checks for).
    """
    if not tensors:
        return 0.0
    with torch.no_grad():  # (no per-tensor detach: a few ops in all, not three per tensor)
        norms = torch._foreach_norm(list(tensors))
        first = norms[0]
        if all(n.device == first.device and n.dtype == first.dtype for n in norms):
            stacked = torch.stack(norms).float()
        else:
            stacked = torch.stack([n.float().to(first.device) for n in norms])
        return float(torch.linalg.vector_norm(stacked))


def global_grad_norm(model_or_params: nn.Module | Iterable[torch.Tensor]) -> float:
    """The global L2 norm of the gradients of a model (or of parameters), as clipping computes it."""
    params = model_or_params.parameters() if isinstance(model_or_params, nn.Module) else model_or_params
    return l2_norm([p.grad for p in params if p.grad is not None])
