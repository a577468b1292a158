"""A model as an ONNX file (what Netron opens), written by the compiler step's one exporter and
checked: the file is loaded by ONNX Runtime, run on the same input, and its outputs compared
with the eager model's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from .._device import call_model
from .._paths import OutputPath, check_outputs, replacing
from .._records import JsonRecord
from ..exceptions import ConfigError, DependencyError, ProftuneError
from ._compile import get_compiler
from ._measure import tensors_of

__all__ = ["OnnxExport", "export_onnx"]


@dataclass(frozen=True)
class OnnxExport(JsonRecord):
    """Where the ONNX file is and how its outputs compared with the eager model's on one input
    (``checked`` False: ONNX Runtime was not asked to run it)."""

    DERIVED: ClassVar[tuple[str, ...]] = ("matches",)

    path: str
    size_bytes: int
    inputs: tuple[str, ...]
    outputs: int
    checked: bool
    max_abs_diff: float | None = None
    #: The largest |onnx - torch| / (atol + rtol * |torch|): <= 1 is within tolerance.
    tolerance_used: float | None = None
    atol: float = 1e-4
    rtol: float = 1e-3

    @property
    def matches(self) -> bool | None:
        return None if self.tolerance_used is None else self.tolerance_used <= 1.0


def export_onnx(model: nn.Module, example: Any, path: str | Path, *, check: bool = True,
                atol: float = 1e-4, rtol: float = 1e-3, force: bool = False) -> OnnxExport:
    """Write ``model`` (in eval mode) traced on ``example`` (a tensor, a tuple of args,
    a dict of kwargs) to the ONNX file ``path``, with a dynamic batch dimension; with ``check``,
    run it in ONNX Runtime (CPU) on ``example`` and compare every output with the model's
    (``|onnx - torch| <= atol + rtol * |torch|``). Needs ``pip install 'proftune[compile]'``."""
    problems = [f"{name} must be a number >= 0, but got {name}={v!r}." for name, v in (("atol", atol), ("rtol", rtol))
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0]
    if problems:
        raise ConfigError(" ".join(problems))
    target = Path(path)
    if target.suffix.lower() != ".onnx":
        raise ConfigError(f"the ONNX file's name must end in .onnx, but got {str(target)!r}.")
    check_outputs([OutputPath("path=", target)], force=force)
    compiler = get_compiler("onnxruntime")
    cpu = torch.device("cpu")
    why = compiler.unavailable(cpu)
    if why is not None:
        raise DependencyError(f"ONNX export: {why}.")
    was_training = model.training
    model.eval()
    try:
        with replacing(target) as tmp:  # beside it, with its suffix: a failed export leaves no file
            try:
                compiler.compile(model, example, tmp, device=cpu)
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ProftuneError(f"torch.onnx.export could not export {type(model).__name__}: {first}") from exc
        inputs = tuple(example) if isinstance(example, dict) else tuple(
            f"input{i}" for i in range(len(example) if isinstance(example, (tuple, list)) else 1))
        if not check:
            return OnnxExport(path=str(target), size_bytes=target.stat().st_size, inputs=inputs, outputs=0,
                              checked=False, atol=float(atol), rtol=float(rtol))
        with torch.no_grad():
            want = tensors_of(call_model(model, example))
        session = compiler.load(target, device=cpu, threads=None)
        got = tensors_of(call_model(session, example))
    finally:
        model.train(was_training)
    if len(got) != len(want):
        raise ProftuneError(f"the ONNX file {str(target)!r} returns {len(got)} tensors where the model returns "
                            f"{len(want)}.")
    worst_abs, worst = 0.0, 0.0
    for g, w in zip(got, want, strict=True):
        if tuple(g.shape) != tuple(w.shape):
            raise ProftuneError(f"the ONNX file {str(target)!r} returns shape {tuple(g.shape)} where the model "
                                f"returns {tuple(w.shape)}.")
        g, w = g.detach().to(cpu).double(), w.detach().to(cpu).double()
        if g.numel() == 0:
            continue
        diff = (g - w).abs()
        worst_abs = max(worst_abs, float(diff.max()))
        worst = max(worst, float((diff / (atol + rtol * w.abs())).max()))
    return OnnxExport(path=str(target), size_bytes=target.stat().st_size, inputs=inputs, outputs=len(want),
                      checked=True, max_abs_diff=worst_abs, tolerance_used=worst if math.isfinite(worst) else math.inf,
                      atol=float(atol), rtol=float(rtol))
