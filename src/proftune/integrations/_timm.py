"""``timm:NAME``: a timm model, random weights, as a :class:`ModuleTask` (nothing is downloaded)."""

from __future__ import annotations

import difflib
from typing import Any

from torch import nn

from .._optional import require
from ..exceptions import ConfigError, TaskLoadError
from ._module_task import ModuleTask

__all__ = ["TIMM_BUILD_PARAMS", "TIMM_PREFIX", "timm_task"]

TIMM_PREFIX = "timm:"
#: Params passed to ``timm.create_model`` when given; ``num_classes`` defaults to 10.
TIMM_BUILD_PARAMS = ("num_classes", "img_size", "in_chans", "drop_rate", "drop_path_rate")
_DEFAULT_CLASSES = 10


def _timm(spec: str) -> Any:
    return require("timm", feature=f"task {spec!r}")


def close_names(timm: Any, name: str, *, limit: int = 8) -> list[str]:
    """timm's model names nearest ``name``: those containing it, else the most similar."""
    base = name.split(".")[0]
    found = list(timm.list_models(f"*{base}*"))[:limit]
    return found or difflib.get_close_matches(base, timm.list_models(), n=limit, cutoff=0.5)


def _img_size(value: Any) -> Any:
    if isinstance(value, str) and "x" in value.lower():
        try:
            return tuple(int(v) for v in value.lower().split("x"))
        except ValueError:
            raise ConfigError(f"param img_size={value!r} is not a size; give e.g. img_size=64 or 64x64.") from None
    return value


def timm_task(spec: str) -> ModuleTask:
    """The task ``timm:NAME`` names: ``timm.create_model(NAME, pretrained=False, num_classes=10)``,
    its kwargs overridden by the params in :data:`TIMM_BUILD_PARAMS`."""
    name = spec[len(TIMM_PREFIX):].strip()
    timm = _timm(spec)
    if not name:
        raise TaskLoadError(f"task {spec!r} names no timm model; give e.g. 'timm:resnet18'.")
    if not timm.is_model(name):
        near = close_names(timm, name)
        hint = f"close names: {', '.join(near)}" if near else "none is close"
        raise TaskLoadError(f"timm has no model {name!r} (task {spec!r}); {hint}. "
                            "All names: python -c \"import timm; print(timm.list_models('*resnet*'))\".")

    def factory(params: dict[str, Any]) -> nn.Module:
        kwargs: dict[str, object] = {"num_classes": _DEFAULT_CLASSES}
        for key in TIMM_BUILD_PARAMS:
            if params.get(key) is not None:
                kwargs[key] = _img_size(params[key]) if key == "img_size" else params[key]
        try:
            return timm.create_model(name, pretrained=False, **kwargs)  # type: ignore[no-any-return]
        except TypeError as exc:
            taken = [k for k in kwargs if k != "num_classes" and repr(k) in str(exc)]
            if not taken:
                raise
            extra = (" (set the input resolution with params={'input_shape': '3x64x64'})"
                     if "img_size" in taken else "")
            raise ConfigError(f"timm model {name!r} takes no param {taken[0]}={kwargs[taken[0]]!r}{extra}.") from exc

    return ModuleTask(factory, name=f"{TIMM_PREFIX}{name}", build_params=TIMM_BUILD_PARAMS,
                      description=f"timm {name} (random weights) as a classifier on synthetic images")
