"""Optional dependencies: imported when a feature needs them, with an error naming the extra.

``EXTRAS`` is the one table of which ``pip install 'proftune[extra]'`` brings which package.
A subpackage that cannot work at all without one says so on its first line of imports,
``from .._optional import optuna``: the module attribute is the imported package, or a
:class:`DependencyError` naming the extra when it is missing.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from .exceptions import DependencyError

__all__ = ["EXTRAS", "pyplot", "require"]

#: Import name of each optional package -> the extra of proftune that installs it.
EXTRAS: dict[str, str] = {
    "optuna": "search",
    "scipy": "search",
    "torch_pruning": "prune",
    "torchao": "quant",
    "matplotlib": "report",
    "plotly": "report",
    "torchvision": "vision",
    "ray": "ray",
    "wandb": "wandb",
    "onnx": "compile",
    "onnxruntime": "compile",
    "onnxscript": "compile",
    "timm": "timm",
    "lightning": "lightning",
    "transformers": "hf",
    "mlflow": "mlflow",
    "tensorboard": "tensorboard",
}


def require(module: str, *, feature: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` for ``feature`` (who needs it, e.g. ``"proftune tune"``); if it is missing, raise
    :class:`DependencyError` naming the extra that installs it (``extra``, else the one ``EXTRAS`` lists)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        name = extra or EXTRAS.get(top)
        how = f"pip install 'proftune[{name}]'" if name else f"pip install {top}"
        raise DependencyError(
            f"{feature}: needs the optional package {top!r}, which is not installed; "
            f"install it with: {how}"
        ) from exc


def pyplot(feature: str) -> Any:
    """``matplotlib.pyplot`` for ``feature``, on the Agg backend (PNG files, no display needed)."""
    require("matplotlib", feature=feature).use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def __getattr__(name: str) -> ModuleType:
    if name in EXTRAS:
        return require(name, feature=f"proftune's {EXTRAS.get(name, name)} features")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
