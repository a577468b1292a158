"""Activation checkpointing of a model's blocks, and which blocks those are.

One definition of a model's *blocks* serves three things: the units FSDP wraps (``fully_shard``
on each, then the root), the regions activation checkpointing recomputes, and the largest unit
that FSDP all-gathers at once. The predictor wraps the blocks of its fake model with the same
function a real run uses, so a checkpointed step is traced, not guessed.

``full``: a block keeps only its input; its forward runs again in backward
(``torch.utils.checkpoint``, non-reentrant). ``selective``: a block also keeps the outputs of
its matmuls and attention (the expensive ops) and recomputes only the cheap ones (PyTorch's
selective activation checkpointing, ``create_selective_checkpoint_contexts``).
"""

from __future__ import annotations

import functools
import warnings
from collections import Counter
from typing import Any

import torch
from torch import nn

__all__ = ["CHECKPOINTING", "apply_activation_checkpointing", "block_units"]

#: The modes of activation checkpointing.
CHECKPOINTING = ("none", "full", "selective")

_MARK = "_proftune_checkpointed"


def block_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks: the children of the container (``ModuleList`` or
    ``Sequential``) holding the most parameters among those with at least two children of one
    type (a transformer's layers); else the model's direct children that hold parameters."""
    best: tuple[int, list[tuple[str, nn.Module]]] = (0, [])
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
            continue
        kids = list(mod.named_children())
        if len(kids) < 2:
            continue
        counts = Counter(type(k).__name__ for _, k in kids)
        kind, n = counts.most_common(1)[0]
        if n < 2:
            continue
        units = [(f"{name}.{k}" if name else k, m) for k, m in kids
                 if type(m).__name__ == kind and any(True for _ in m.parameters())]
        size = sum(p.numel() for _, m in units for p in m.parameters())
        if size > best[0]:
            best = (size, units)
    if best[1]:
        return best[1]
    return [(k, m) for k, m in model.named_children() if any(True for _ in m.parameters())]


_SAVE = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
         "_scaled_dot_product_flash_attention_for_cpu", "_scaled_mm")


def _selective_context() -> Any:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save = {getattr(torch.ops.aten, n).default for n in _SAVE if hasattr(torch.ops.aten, n)}

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _checkpointed(forward: Any, mode: str) -> Any:
    from torch.utils.checkpoint import checkpoint

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        if mode == "selective":
            with warnings.catch_warnings():  # torch's note on saved-tensor hooks around SAC: not the user's
                warnings.filterwarnings("ignore", message=".*saved_tensors_hooks.*", category=FutureWarning)
                return checkpoint(forward, *args, use_reentrant=False, context_fn=_selective_context, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def apply_activation_checkpointing(model: nn.Module, mode: str = "full") -> str:
    """Wrap the forward of each of ``model``'s blocks (:func:`block_units`) in activation
    checkpointing of ``mode`` (``none``, ``full``, ``selective``), in place; returns ``mode``."""
    if mode not in CHECKPOINTING:
        from ..exceptions import ConfigError

        raise ConfigError(f"activation_checkpointing={mode!r} is unknown; valid: {', '.join(CHECKPOINTING)}.")
    if mode == "none":
        return mode
    for _, unit in block_units(model):
        if getattr(unit, _MARK, None):
            continue
        unit.forward = _checkpointed(unit.forward, mode)
        setattr(unit, _MARK, mode)
    return mode
