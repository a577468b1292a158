"""Quantization backends behind one small base class, registered in one registry.

A backend quantizes with one method (dynamic, static, qat) through one library, says whether it
can run here (and why not), and names the format its models are saved in. A new backend is one
subclass and its registration (``@register_quant_backend``, or the ``proftune.quant_backends``
entry point group); the built-ins register the same way. Its library name is then valid for
``--quant-backend`` and ``compress(quant_backend=)``, and is measured beside the others.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
from torch import nn

from .._registry import LiveSequence, Registry
from ..exceptions import ConfigError, ProblemCollector
from . import _quantize as recipes
from ._checkpoint import FORMATS

__all__ = [
    "BACKEND_NAMES",
    "QUANT_BACKENDS",
    "QUANT_BACKEND_REGISTRY",
    "BaseQuantBackend",
    "QuantInputs",
    "TorchAODynamic",
    "TorchAOQAT",
    "TorchAOStatic",
    "TorchaoDynamic",
    "backend_status",
    "get_backend",
    "register_quant_backend",
]


@dataclass
class QuantInputs:
    """What a method may need besides the float model: CPU example inputs, a calibration run
    (static: feeds a few batches through the observed model) and a training run (QAT: fine-tunes
    the fake-quantized model in place with the fit loop)."""

    example: Any = None
    calibrate: Callable[[nn.Module], None] | None = None
    train: Callable[[nn.Module], None] | None = None


class BaseQuantBackend(abc.ABC):
    """One quantization method of one library."""

    #: The library, as ``--quant-backend`` names it: ``torch.ao`` or ``torchao``.
    name: ClassVar[str]
    #: ``dynamic``, ``static`` or ``qat``.
    method: ClassVar[str]
    #: How its models are saved (``_checkpoint.FORMATS``).
    save_format: ClassVar[str]

    @property
    def key(self) -> str:
        """Its registry key, ``library:method`` (``torch.ao:static``)."""
        return f"{self.name}:{self.method}"

    @abc.abstractmethod
    def unavailable(self, device: torch.device, model: nn.Module | None = None) -> str | None:
        """None when this backend can quantize ``model`` for ``device``, else the reason it cannot."""

    def available(self, device: torch.device, model: nn.Module | None = None) -> bool:
        return self.unavailable(device, model) is None

    @abc.abstractmethod
    def quantize(self, model: nn.Module, inputs: QuantInputs) -> nn.Module:
        """An INT8 copy of the float ``model`` (the original is left as it was)."""


#: Every backend by ``library:method``, in the order they are tried; the fastest measured one is kept.
QUANT_BACKEND_REGISTRY: Registry[BaseQuantBackend] = Registry(
    "quantization backend", key=lambda b: b.key, entry_points="proftune.quant_backends")
#: Every backend object, read from the registry on each use.
QUANT_BACKENDS = LiveSequence(lambda: tuple(QUANT_BACKEND_REGISTRY.values()))
#: The libraries ``--quant-backend`` names (besides ``auto``), read from the registry.
BACKEND_NAMES = LiveSequence(lambda: tuple(dict.fromkeys(b.name for b in QUANT_BACKEND_REGISTRY.values())))

B = TypeVar("B")


def register_quant_backend(backend: B) -> B:
    """Register a :class:`BaseQuantBackend` subclass (built with no arguments) or instance under
    ``library:method``; usable as a class decorator. Its ``name`` is then a ``--quant-backend``."""
    obj: Any = backend() if isinstance(backend, type) else backend
    if not isinstance(obj, BaseQuantBackend):
        raise ConfigError(f"backend={backend!r} is not a proftune.compress.BaseQuantBackend.")
    p = ProblemCollector()
    label = type(obj).__name__
    name, method, fmt = (getattr(obj, a, None) for a in ("name", "method", "save_format"))
    if not isinstance(name, str) or not name or name == "auto":
        p.add(f"{label}.name must be a non-empty string other than 'auto', but got {name!r}.")
    if method not in recipes.QUANT_METHODS:
        p.add(f"{label}.method={method!r} is unknown; valid: {', '.join(recipes.QUANT_METHODS)}.")
    if fmt not in FORMATS:
        p.add(f"{label}.save_format={fmt!r} is unknown; valid: {', '.join(FORMATS)}.")
    if p.problems:
        raise ConfigError(p.problems)
    QUANT_BACKEND_REGISTRY.add(obj, origin=backend)
    return backend


QUANT_BACKEND_REGISTRY.loads_through(register_quant_backend)


class _TorchAO(BaseQuantBackend):
    """``torch.ao.quantization``: INT8 kernels on CPU through the x86/fbgemm/onednn/qnnpack engines."""

    name = "torch.ao"
    save_format = "torchscript"

    def unavailable(self, device: torch.device, model: nn.Module | None = None) -> str | None:
        if device.type != "cpu":
            return (f"torch.ao.quantization's INT8 kernels run on CPU only; the device is {device.type} "
                    "(use --device cpu)")
        if recipes.quantized_engine() is None:
            return ("no quantized engine (x86, fbgemm, onednn, qnnpack) is built into this torch; "
                    f"torch.backends.quantized.supported_engines={recipes.supported_engines()}")
        return None


@register_quant_backend
class TorchAODynamic(_TorchAO):
    """Dynamic INT8 of Linear and LSTM: weights INT8, activations quantized on the fly."""

    method = "dynamic"

    def quantize(self, model: nn.Module, inputs: QuantInputs) -> nn.Module:
        return recipes.torch_ao_dynamic(model)


@register_quant_backend
class TorchAOStatic(_TorchAO):
    """Static post-training INT8 (FX graph mode): fuse conv-bn-relu, calibrate observers, convert."""

    method = "static"

    def quantize(self, model: nn.Module, inputs: QuantInputs) -> nn.Module:
        if inputs.calibrate is None:
            raise ConfigError("static quantization needs inputs.calibrate (a run over a few batches).")
        return recipes.quantize_static(model, inputs.example, inputs.calibrate)


@register_quant_backend
class TorchAOQAT(_TorchAO):
    """Quantization-aware training: fake-quantize, fine-tune with the fit loop, convert."""

    method = "qat"

    def quantize(self, model: nn.Module, inputs: QuantInputs) -> nn.Module:
        if inputs.train is None:
            raise ConfigError("qat needs inputs.train (the fit loop over the fake-quantized model).")
        prepared = recipes.prepare_qat(model, inputs.example)
        inputs.train(prepared)
        return recipes.convert_qat(prepared)


def _import_torchao() -> None:
    """Import torchao with torch's pytree logger quiet: its import logs a deprecation of torch's
    own (``register_constant()`` on an Enum) to stderr, noise to a user of proftune."""
    import logging

    pytree = logging.getLogger("torch.utils._pytree")
    level = pytree.level
    pytree.setLevel(logging.ERROR)
    try:
        import torchao  # noqa: F401
    finally:
        pytree.setLevel(level)


@register_quant_backend
class TorchaoDynamic(BaseQuantBackend):
    """torchao's dynamic INT8 Linear (tensor subclasses; CPU and CUDA), saved with torch.export."""

    name = "torchao"
    method = "dynamic"
    save_format = "export"

    def unavailable(self, device: torch.device, model: nn.Module | None = None) -> str | None:
        try:
            _import_torchao()
        except ImportError:
            return "torchao is not installed (pip install 'proftune[quant]')"
        if model is not None and not any(isinstance(m, nn.Linear) for m in model.modules()):
            return "torchao's dynamic INT8 quantizes nn.Linear only; the model has none"
        return None

    def quantize(self, model: nn.Module, inputs: QuantInputs) -> nn.Module:
        import copy

        _import_torchao()
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        quantized = copy.deepcopy(model).eval()
        quantize_(quantized, Int8DynamicActivationInt8WeightConfig())
        return quantized


#: Why a library has no backend for a method (said instead of a bare "unsupported").
_MISSING = {
    ("torchao", "static"): "torchao's static INT8 for conv models runs only as a torch.compile (pt2e + "
                           "inductor) graph, not as a saved eager model",
    ("torchao", "qat"): "torchao's qat INT8 for conv models runs only as a torch.compile (pt2e + "
                        "inductor) graph, not as a saved eager model",
}


def get_backend(name: str, method: str) -> BaseQuantBackend | None:
    """The backend of library ``name`` for ``method``, or None when it has none."""
    return QUANT_BACKEND_REGISTRY.get(f"{name}:{method}")


def backend_status(method: str, device: torch.device, model: nn.Module | None = None) -> dict[str, str | None]:
    """For each library, None when it can run ``method`` on ``device``, else the reason it cannot."""
    status: dict[str, str | None] = {}
    for name in BACKEND_NAMES:
        backend = get_backend(name, method)
        if backend is None:
            status[name] = _MISSING.get((name, method), f"{name} has no {method} INT8 backend")
        else:
            status[name] = backend.unavailable(device, model)
    return status

