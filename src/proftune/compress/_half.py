"""Half precision as a compression method: the weights in fp16, the inputs cast on the way in.

The wrapper casts floating inputs to the model's half dtype and its floating outputs back to
fp32, so that the task's loss and metric read it like the float model; ``torch.export`` keeps the
casts in the saved graph (format ``export``). Half the bytes of every weight; fast where the
device has half-precision matmul units (GPU tensor cores, ARM fp16), slow where it converts
(most x86 CPUs): the latency is measured, not assumed.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from ._checkpoint import example_args

__all__ = ["HalfPrecision", "save_half"]


class HalfPrecision(nn.Module):
    """A copy of ``model`` in ``dtype`` (fp16 by default) that takes and returns fp32 tensors."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.float16) -> None:
        super().__init__()
        self.model = copy.deepcopy(model).to(dtype).eval()
        self.dtype = dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        def down(t: Any) -> Any:
            return t.to(self.dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

        def up(t: Any) -> Any:
            return t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t

        return tree_map(up, self.model(*tree_map(down, args), **tree_map(down, kwargs)))


def save_half(model: HalfPrecision, path: Any, example: Any) -> None:
    """``torch.export`` the wrapper (its ``*args`` take one nested dynamic-batch spec) to ``path``:
    format ``export``, loaded by ``load_model``."""
    args = example_args(example)
    batch = torch.export.Dim.DYNAMIC
    spec = tuple({0: batch} if isinstance(a, torch.Tensor) and a.dim() > 0 else None for a in args)
    program = torch.export.export(model, args, dynamic_shapes=(spec,))
    with open(path, "wb") as f:
        torch.export.save(program, f)
