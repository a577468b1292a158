"""INT8 quantization: dynamic, static post-training, and quantization-aware.

The torch.ao recipes (``torch.ao.quantization`` FX graph mode, which fuses conv-bn-relu and
calibrates observers, its INT8 kernels on CPU through the x86/fbgemm/qnnpack engines). The
backends (``_quant_backends``: these recipes, and torchao's ``quantize_`` with tensor
subclasses, dynamic INT8 Linear on CPU and CUDA) call them; nothing here knows the backends.
Where both can do a method, both are built and timed on the device and the faster one is kept.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import torch
from torch import nn

from ..exceptions import ConfigError

__all__ = [
    "QUANT_METHODS",
    "convert_qat",
    "prepare_qat",
    "quantize_static",
    "quantized_engine",
    "run_batches",
    "supported_engines",
    "torch_ao_dynamic",
]

QUANT_METHODS = ("dynamic", "static", "qat")
_ENGINES = ("x86", "fbgemm", "onednn", "qnnpack")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch.ao.quantization warns on import and use that it is deprecated; it is still the
    fastest CPU INT8 path in this torch, so the warning is noise to a user of proftune."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*deprecated.*")
        warnings.filterwarnings("ignore", category=UserWarning, module="torch.ao")
        yield


def supported_engines() -> list[str]:
    """The quantized engines compiled into this torch (x86, fbgemm, onednn, qnnpack)."""
    return list(torch.backends.quantized.supported_engines)


def quantized_engine() -> str | None:
    """The first of x86, fbgemm, onednn, qnnpack built into this torch, or None."""
    supported = supported_engines()
    for name in _ENGINES:
        if name in supported:
            return name
    return None


def torch_ao_dynamic(model: nn.Module) -> nn.Module:
    """torch.ao's dynamic INT8 of Linear and LSTM layers (CPU)."""
    with _quiet():
        from torch.ao.quantization import quantize_dynamic as tq_dynamic

        torch.backends.quantized.engine = quantized_engine() or torch.backends.quantized.engine
        return cast(nn.Module, tq_dynamic(copy.deepcopy(model).cpu().eval(), {nn.Linear, nn.LSTM}, dtype=torch.qint8))


def _fx_error(exc: Exception, method: str) -> ConfigError:
    return ConfigError(
        f"{method} quantization traces the model with torch.fx and the trace failed "
        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); use quantize="
        "'dynamic', or make the forward traceable (no data-dependent control flow)."
    )


def quantize_static(model: nn.Module, example: Any, calibrate: Callable[[nn.Module], None]) -> nn.Module:
    """Static post-training INT8 (torch.ao FX): fuse conv-bn-relu, observe, convert.

    ``calibrate(prepared)`` runs the task's data through the observed model (a few batches).
    """
    with _quiet():
        from torch.ao.quantization import get_default_qconfig_mapping
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

        engine = quantized_engine() or "x86"
        torch.backends.quantized.engine = engine
        float_model = copy.deepcopy(model).cpu().eval()
        try:
            prepared = prepare_fx(float_model, get_default_qconfig_mapping(engine), _tuple(example))
        except Exception as exc:
            raise _fx_error(exc, "static") from exc
        with torch.no_grad():
            calibrate(prepared)
        return convert_fx(prepared)


def prepare_qat(model: nn.Module, example: Any) -> nn.Module:
    """A copy of ``model`` with fake-quantize modules (fused conv-bn-relu), ready to train."""
    with _quiet():
        from torch.ao.quantization import get_default_qat_qconfig_mapping
        from torch.ao.quantization.quantize_fx import prepare_qat_fx

        engine = quantized_engine() or "x86"
        torch.backends.quantized.engine = engine
        trainable = copy.deepcopy(model).cpu().train()
        try:
            return prepare_qat_fx(trainable, get_default_qat_qconfig_mapping(engine), _tuple(example))
        except Exception as exc:
            raise _fx_error(exc, "qat") from exc


def convert_qat(prepared: nn.Module) -> nn.Module:
    """The INT8 model from a fake-quantized one trained by the fit loop."""
    with _quiet():
        from torch.ao.quantization.quantize_fx import convert_fx

        return convert_fx(copy.deepcopy(prepared).cpu().eval())  # type: ignore[arg-type]


def _tuple(example: Any) -> tuple[Any, ...]:
    if isinstance(example, (tuple, list)):
        return tuple(e.cpu() if isinstance(e, torch.Tensor) else e for e in example)
    return (example.cpu() if isinstance(example, torch.Tensor) else example,)


def run_batches(
    task_loss: Callable[[nn.Module, Any], Any], batches: Iterable[Any], limit: int,
) -> Callable[[nn.Module], None]:
    """A calibration function: feed up to ``limit`` batches through ``task_loss(model, batch)``.

    The task's own loss drives the forward, so any batch layout the task understands works.
    """

    def calibrate(model: nn.Module) -> None:
        for i, batch in enumerate(batches):
            if i >= limit:
                break
            task_loss(model, batch)

    return calibrate
