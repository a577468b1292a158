"""The model's structure: the module tree with each module's input/output shapes, params and MACs.

What ``torchinfo.summary`` prints, computed by proftune's one FLOP counter (:func:`count_model`):
a module's MACs are those of every op that ran while it or a module under it was running, so a
container's MACs are its subtree's, attention matmuls done functionally inside a module are in
it, and the root's MACs are the model's. torchinfo instead estimates MACs from parameter counts
(``batch x params`` for any non-conv layer, bias included, functional ops 0): on a convnet the
totals agree within the bias terms, on a transformer torchinfo misses the sequence length and the
attention (``benchmarks/structure.py`` prints both).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from .._device import batch_size_of, capture_inputs, move_to_device, resolve_device
from .._records import JsonRecord, Reader, each
from ..exceptions import ConfigError
from ..task import Task, load_task
from ..train import TrainParams, seed_everything
from ._assemble import static_counts
from ._layers import module_names, shapes_of

__all__ = ["STRUCTURE_SCHEMA_VERSION", "ModuleRow", "Structure", "model_and_input", "model_structure"]

STRUCTURE_SCHEMA_VERSION = 1


def _shape_list(value: Any) -> list[Any]:
    return [list(s) if isinstance(s, tuple) else s for s in shapes_of(value)]


@dataclass(frozen=True)
class ModuleRow(JsonRecord):
    """One module of the tree (``name`` its path, ``""`` the model; ``depth`` 0 for the model).

    ``params``/``trainable``: its parameters and those of the modules under it, each tensor once;
    ``own_params``: its own only. ``macs``: forward multiply-accumulates of its subtree over all its
    calls. Shapes are those of its first call (positional then keyword inputs; a non-tensor by
    its type name); a module that never ran has ``calls`` 0 and no shapes.
    """

    WHAT: ClassVar[str] = "a structure's module row"

    name: str
    type: str
    depth: int
    params: int = 0
    trainable: int = 0
    own_params: int = 0
    macs: int = 0
    calls: int = 0
    input_shapes: list[Any] = field(default_factory=list)
    output_shapes: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Structure(JsonRecord):
    """The module tree of a model for one input: rows in definition order, the totals."""

    WHAT: ClassVar[str] = "a model structure"
    SCHEMA: ClassVar[int | None] = STRUCTURE_SCHEMA_VERSION
    READERS: ClassVar[dict[str, Reader]] = {"rows": lambda rows: tuple(each(ModuleRow.from_dict)(rows))}

    rows: tuple[ModuleRow, ...] = ()
    params_total: int = 0
    params_trainable: int = 0
    macs: int = 0
    flops: int = 0
    #: Rows of the example input (its first tensor's leading dimension).
    batch_size: int = 0
    schema_version: int = STRUCTURE_SCHEMA_VERSION

    def row(self, name: str) -> ModuleRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no module {name!r} in this structure; modules: {[r.name for r in self.rows][:20]}")

    def leaves(self) -> list[ModuleRow]:
        """Rows of modules without children (the model itself when it has none)."""
        names = [r.name for r in self.rows]
        return [r for r in self.rows if not any(n.startswith(r.name + ".") or (r.name == "" and n)
                                                for n in names if n != r.name)]



def _recursive_params(mod: nn.Module) -> tuple[int, int]:
    total = trainable = 0
    for p in mod.parameters():  # each tensor once, within this module
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return total, trainable


def model_structure(model: nn.Module, example_input: Any, *, train: bool = False) -> Structure:
    """The module tree of ``model`` fed ``example_input`` (a tensor, a tuple of args, a dict of
    kwargs): shapes, params and MACs per module, counted on one forward in eval mode (``train``:
    training mode). The model's parameters, buffers, mode and the global RNG are left as they were."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model must be a torch.nn.Module, but got {type(model).__name__}.")
    names = module_names(model)
    first: dict[str, tuple[list[Any], list[Any]]] = {}
    calls: dict[str, int] = {}
    pending: dict[str, list[Any]] = {}
    handles = []

    def pre(mod: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        name = names[id(mod)]
        calls[name] = calls.get(name, 0) + 1
        if name not in first and name not in pending:
            pending[name] = _shape_list((args, kwargs)) if kwargs else _shape_list(args)

    def post(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        name = names[id(mod)]
        if name in pending:
            first[name] = (pending.pop(name), _shape_list(output))

    seen: set[int] = set()
    for mod in model.modules():
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post))
    try:
        counts = static_counts(model, example_input, backward=False, train=train)
    finally:
        for h in handles:
            h.remove()
    own_macs = {name: c.macs for name, c in counts.layers.items()}
    rows = []
    listed: set[int] = set()
    for name, mod in model.named_modules():
        if id(mod) in listed:
            continue
        listed.add(id(mod))
        total, trainable = _recursive_params(mod)
        own = sum(p.numel() for p in mod.parameters(recurse=False))
        prefix = name + "."
        macs = counts.macs if name == "" else sum(
            v for n, v in own_macs.items() if n == name or n.startswith(prefix))
        ins, outs = first.get(name, ([], []))
        rows.append(ModuleRow(name=name, type=type(mod).__name__, depth=0 if name == "" else name.count(".") + 1,
                              params=total, trainable=trainable, own_params=own, macs=int(macs),
                              calls=calls.get(name, 0), input_shapes=ins, output_shapes=outs))
    return Structure(rows=tuple(rows), params_total=counts.params_total, params_trainable=counts.params_trainable,
                     macs=counts.macs, flops=counts.flops, batch_size=batch_size_of(example_input))


def model_and_input(task: Task | str, *, params: Mapping[str, Any] | None = None, batch_size: int | None = None,
                    seed: int = 0, device: str | torch.device = "cpu") -> tuple[nn.Module, Any]:
    """The task's model as built at ``params`` from ``seed`` (before any training) on ``device``,
    in eval mode, and the input its loss feeds it for the first training batch at ``batch_size``
    (default the task's): what the structure is counted on and what ONNX export traces."""
    t = load_task(task)
    given = TrainParams.of(t, params, **({} if batch_size is None else {"batch_size": batch_size}))
    bs = given.batch_size or 32
    given = given if given.batch_size else given.with_params(batch_size=bs)  # the data reads it
    dev = resolve_device(device)
    seed_everything(seed)
    model = t.build_model(given.params).to(dev)
    batch = move_to_device(_first_batch(t, bs, given), dev)
    model.eval()
    example = capture_inputs(t.loss, model, batch)
    return model, example


def _first_batch(task: Task, batch_size: int, params: TrainParams) -> Any:
    for batch in task.train_data(batch_size, params.params):
        return batch
    return task.example_batch(batch_size)

