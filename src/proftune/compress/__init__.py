"""Compression under an accuracy budget: prune, quantize, distill, measure, select.

``proftune.compress(task, ...)`` is the entry point; the pieces are public for reuse.
"""

from __future__ import annotations

from .._callable import make_callable as _make_callable
from .._deprecated import renamed
from ._api import compress
from ._checkpoint import LOAD_LINES, ExportedModule, load_model
from ._compile import COMPILER_REGISTRY, COMPILERS, BaseCompiler, register_compiler
from ._config import CompressConfig
from ._distill import DistillationTask, hinton_loss
from ._methods import COMPRESS_METHODS, BaseCompressMethod, MethodContext, register_method
from ._onnx import OnnxExport, export_onnx
from ._pipeline import Candidate
from ._prune import prune_structured, prune_unstructured
from ._quant_backends import (
    QUANT_BACKEND_REGISTRY,
    QUANT_BACKENDS,
    BaseQuantBackend,
    QuantInputs,
    backend_status,
    register_quant_backend,
)
from ._records import CompressResult
from ._sensitivity import LayerSensitivity, layer_sensitivity, ratios_from_sensitivity

__all__ = [
    "COMPILERS",
    "COMPILER_REGISTRY",
    "COMPRESS_METHODS",
    "LOAD_LINES",
    "QUANT_BACKENDS",
    "QUANT_BACKEND_REGISTRY",
    "BaseCompiler",
    "BaseCompressMethod",
    "BaseQuantBackend",
    "Candidate",
    "CompressConfig",
    "CompressResult",
    "DistillationTask",
    "ExportedModule",
    "LayerSensitivity",
    "MethodContext",
    "OnnxExport",
    "QuantInputs",
    "backend_status",
    "compress",
    "export_onnx",
    "hinton_loss",
    "layer_sensitivity",
    "load_model",
    "prune_structured",
    "prune_unstructured",
    "ratios_from_sensitivity",
    "register_compiler",
    "register_method",
    "register_quant_backend",
]

#: Former names, deprecated (a DeprecationWarning names the current one).
__getattr__ = renamed(__name__, {"CompressReport": "CompressResult", "BACKENDS": "QUANT_BACKENDS"})

# ``proftune.compress(...)`` calls :func:`compress`: the subpackage is the one object of the name.
_make_callable(__name__)
