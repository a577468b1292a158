"""The extension point for a compression method of one's own: a :class:`BaseCompressMethod`
registered in :data:`COMPRESS_METHODS`.

A method turns a float model into another model (weight clustering, low-rank factorisation, a
distilled student, ...). The compressor applies it to every float model of the run (the baseline
and each pruned model: ``structured+NAME``), then saves, reloads and measures the result like
every other candidate, so it is judged on the same accuracy budget and goal, and shows up in
the result, its JSON and the report. Quantization backends (``QUANT_BACKEND_REGISTRY``,
``@register_quant_backend``) and compilers (``COMPILER_REGISTRY``, ``@register_compiler``) are
registries of their own, built the same way: each carries more than a method (an INT8 method
and its calibration inputs; an engine's file, its loader and its load line).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from .._registry import Registry
from ..exceptions import ConfigError

__all__ = ["COMPRESS_METHODS", "BaseCompressMethod", "MethodContext", "register_method"]


@dataclass(frozen=True)
class MethodContext:
    """What a method may use: the model's example inputs on ``device``, the task and its params,
    and ``finetune(model, epochs)``, which trains through the one fit loop."""

    example: Any
    task: Any
    params: dict[str, Any]
    device: torch.device
    finetune: Callable[[nn.Module, int], None]


class BaseCompressMethod(abc.ABC):
    """One compression method: ``apply`` returns the compressed model (a new module or ``model``
    changed in place; it receives a copy). ``save_format`` is how its model is written
    (``state``: a state dict the task's model loads; ``export``: a torch.export graph, for a
    module of another class)."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    save_format: ClassVar[str] = "export"

    def unavailable(self, device: torch.device) -> str | None:
        """Why this method cannot run on ``device`` (None: it can)."""
        return None

    @abc.abstractmethod
    def apply(self, model: nn.Module, context: MethodContext) -> nn.Module:
        """The compressed model of ``model``."""


#: Every compression method of one's own, by name (``compress(methods=("NAME",))``, ``--method``).
COMPRESS_METHODS: Registry[BaseCompressMethod] = Registry(
    "compression method", key=lambda m: m.name, entry_points="proftune.compress_methods")


def register_method(method: Any) -> Any:
    """Register a :class:`BaseCompressMethod` subclass (built with no arguments) or instance;
    usable as a class decorator."""
    obj = method() if isinstance(method, type) else method
    if not isinstance(obj, BaseCompressMethod):
        raise ConfigError(f"method={method!r} is not a proftune.compress.BaseCompressMethod.")
    problems = []
    if not isinstance(getattr(obj, "name", None), str) or not obj.name or "+" in obj.name:
        problems.append(f"{type(obj).__name__}.name must be a non-empty string without '+', "
                        f"but got {getattr(obj, 'name', None)!r}.")
    if obj.save_format not in ("state", "export"):
        problems.append(f"{type(obj).__name__}.save_format={obj.save_format!r} is unknown; "
                        "valid: state, export.")
    if problems:
        raise ConfigError(problems)
    COMPRESS_METHODS.add(obj, origin=method)
    return method


COMPRESS_METHODS.loads_through(register_method)
