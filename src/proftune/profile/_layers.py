"""Which modules are layers, and forward hooks that see each layer call as it happens.

:class:`LayerHooks` is the one "which module runs now" stack of proftune: the timer, the
statistics and the memory profile listen to it, the FLOP counter (:func:`count_model`) and the
step predictor attribute ops to its :attr:`~LayerHooks.current` module, and compress names the
layer a failing forward stopped in from it.

A *layer* is a module call during which no other module ran: a leaf module, or a module that
applies its children functionally (``nn.MultiheadAttention`` uses ``out_proj``'s weights without
calling it). That is decided at run time, so any model works without a table of layer types;
the names are module paths, the same names :func:`count_model` reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._pytree import tree_flatten

from .._device import clock

__all__ = ["LayerHooks", "module_names", "output_tensors", "shapes_of"]


def module_names(model: nn.Module) -> dict[int, str]:
    """``id(module) -> path``; a module reachable under several paths keeps the first."""
    names: dict[int, str] = {}
    for name, mod in model.named_modules():
        names.setdefault(id(mod), name)
    return names


def output_tensors(output: Any) -> list[torch.Tensor]:
    """Every tensor in a module's output (tuples, dicts, nested)."""
    if isinstance(output, torch.Tensor):  # the common case, without the pytree walk
        return [output]
    leaves, _ = tree_flatten(output)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def shapes_of(value: Any) -> list[Any]:
    """Shapes of the tensors in ``value`` (other leaves by type name), for error messages."""
    leaves, _ = tree_flatten(value)
    out: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            out.append(tuple(leaf.shape))
        elif isinstance(leaf, nn.utils.rnn.PackedSequence):
            out.append(("PackedSequence", tuple(leaf.data.shape)))
        else:
            out.append(type(leaf).__name__)
    return out


#: on_leaf(name, module, inputs, output, start_s, end_s): a layer call that just finished.
LeafCallback = Callable[[str, nn.Module, tuple[Any, ...], Any, float, float], None]
#: on_enter(name, module, inputs): any module call of the model starts (its frame is pushed).
EnterCallback = Callable[[str, nn.Module, tuple[Any, ...]], None]
#: on_exit(name, module): any module call of the model ends (its frame is popped).
ExitCallback = Callable[[str, nn.Module], None]


class LayerHooks:
    """Forward pre/post hooks that report each *layer* call of ``model``.

    ``on_leaf`` runs after a call during which no other module of the model ran, with the
    call's start and end (``time.perf_counter`` seconds; the device is synchronised first when
    ``sync`` is set). ``current`` is the path of the innermost module running now (``None``
    between modules), used to attribute work such as saved tensors or an op's FLOPs to a layer;
    ``enter_listeners`` and ``exit_listeners`` see every module call, layer or not. When a
    forward raises, the frames of the modules it was in stay until the next :meth:`attach`, so
    ``current`` still names the module the error came from. ``with hooks:`` attaches and detaches.

    The hooks are torch's global module hooks, registered once per :meth:`attach` (two handles
    whatever the depth: registering a pair on each of a deep model's thousands of modules cost
    more than the step) and ignoring modules that are not the model's; a module called inside
    the model's forward that was added after this object was built is named on first sight.
    """

    def __init__(self, model: nn.Module, on_leaf: LeafCallback | None = None, *,
                 sync: bool = False, device: torch.device | None = None) -> None:
        self.model = model
        #: Called for every layer call; several parts (timer, statistics) can share one set of hooks.
        self.listeners: list[LeafCallback] = [on_leaf] if on_leaf is not None else []
        #: Called with the time (s) when the outermost module call (the model's forward) starts
        #: and ends.
        self.forward_start_listeners: list[Callable[[float], None]] = []
        self.forward_end_listeners: list[Callable[[float], None]] = []
        self.enter_listeners: list[EnterCallback] = []
        self.exit_listeners: list[ExitCallback] = []
        self.sync = sync and device is not None and device.type == "cuda"
        self.device = device
        self.names = module_names(model)
        #: The layers seen while attached, in the order they first ran (kept across attaches).
        self.layers: dict[str, str] = {}
        # frames of the running modules: [module id, name, start_s, child_ran]
        self._stack: list[list[Any]] = []
        self._handles: list[Any] = []
        self._foreign: dict[int, str] = {}  # modules called inside the forward that are not the model's

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    @property
    def current(self) -> str | None:
        return self._stack[-1][1] if self._stack else None

    def attach(self) -> LayerHooks:
        if self._handles:
            return self
        self._stack.clear()
        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post)]
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stack.clear()

    def __enter__(self) -> LayerHooks:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        # the frames stay readable after a failed forward (see the class docstring)
        for h in self._handles:
            h.remove()
        self._handles.clear()

    @property
    def stack(self) -> list[str]:
        """The paths of the modules whose forward is running, innermost last."""
        return [frame[1] for frame in self._stack]

    def _now(self) -> float:
        return clock(self.device) if self.sync else time.perf_counter()

    def _name_late(self, mod: nn.Module) -> str:
        """The path of a module that joined the model after ``names`` was built (its type name
        when it is not the model's: a foreign module called inside the model's forward)."""
        self.names = module_names(self.model)
        name = self.names.get(id(mod))
        if name is None:
            name = self._foreign[id(mod)] = type(mod).__name__
        return name

    def _pre(self, mod: nn.Module, inputs: tuple[Any, ...]) -> None:
        stack = self._stack
        name = self.names.get(id(mod))
        if name is None:
            if not stack:
                return  # another model's module
            name = self._foreign.get(id(mod)) or self._name_late(mod)
        now = self._now()
        if stack:
            stack[-1][3] = True
        else:
            for begin in self.forward_start_listeners:
                begin(now)
        stack.append([id(mod), name, now, False])
        for enter in self.enter_listeners:
            enter(name, mod, inputs)

    def _post(self, mod: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
        stack = self._stack
        if not stack or stack[-1][0] != id(mod):
            return
        end = self._now()
        _, name, start, child_ran = stack.pop()
        for leave in self.exit_listeners:
            leave(name, mod)
        if not child_ran:
            if name not in self.layers:
                self.layers[name] = type(mod).__name__
            for listener in self.listeners:
                listener(name, mod, inputs, output, start, end)
        if not stack:
            for done in self.forward_end_listeners:
                done(end)
