"""The compiler step of compression: engines a model is deployed with, behind one small base class.

- ``inductor``: ``torch.export`` then AOTInductor (``torch._inductor.aoti_compile_and_package``):
  the graph compiled ahead of time into a ``.pt2`` package of native kernels and weights, loaded
  with ``torch._inductor.aoti_load_package`` (it runs the compiled code: load only packages you
  built or trust).
- ``onnxruntime``: ``torch.onnx.export`` (the dynamo exporter) to a ``.onnx`` graph run by an ONNX
  Runtime ``InferenceSession``: the CPU execution provider here; CUDA and TensorRT providers
  where they are installed and the device is a GPU.

Both keep a dynamic batch dimension, so one artifact serves batch 1, the task's batch and the
last partial batch of the validation data. A new engine is one subclass and its registration
(``@register_compiler``, or the ``proftune.compilers`` entry point group), as the built-ins are;
its name is then valid for ``--compile`` and ``compress(compile=)``.
"""

from __future__ import annotations

import abc
import contextlib
import importlib.util
import io
import logging
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

import torch
from torch import nn

from .._registry import LiveSequence, Registry
from ..exceptions import ConfigError, ProblemCollector
from ._checkpoint import LOAD_LINES, example_args

__all__ = ["COMPILERS", "COMPILER_NAMES", "COMPILER_REGISTRY", "BaseCompiler", "OrtModule", "compiler_status",
           "get_compiler", "load_line_of", "register_compiler"]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporters print progress to stdout and warn on stderr; a user of proftune (and
    ``--json``, whose stdout is one object) needs neither."""
    loggers = [logging.getLogger(n) for n in (
        "torch", "torch.onnx", "torch._dynamo", "torch._inductor", "torch.export", "torch.utils._pytree",
        "torch.utils.cpp_extension", "torch.fx.experimental.symbolic_shapes", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _dynamic(args: tuple[Any, ...]) -> tuple[Any, ...]:
    batch = torch.export.Dim.DYNAMIC
    return tuple({0: batch} if isinstance(a, torch.Tensor) and a.dim() > 0 else None for a in args)


class BaseCompiler(abc.ABC):
    """One deployment engine: compiles a float eager model to a file and loads it back."""

    #: The method name a candidate carries (``--compile`` names it).
    name: ClassVar[str]
    #: The file's format and suffix; a format that ``_checkpoint.LOAD_LINES`` lacks needs ``load_line``.
    save_format: ClassVar[str]
    suffix: ClassVar[str]
    #: The one line that loads a saved file (``{path!r}`` is replaced), for a format of its own.
    load_line: ClassVar[str | None] = None

    @abc.abstractmethod
    def unavailable(self, device: torch.device) -> str | None:
        """None when this engine can run on ``device`` here, else the reason it cannot."""

    @abc.abstractmethod
    def compile(self, model: nn.Module, example: Any, path: Path, *, device: torch.device) -> None:
        """Write ``model`` (eval mode, on ``device``), traced on ``example``, compiled to ``path``."""

    @abc.abstractmethod
    def load(self, path: Path, *, device: torch.device, threads: int | None) -> nn.Module:
        """The compiled model in ``path`` as a module that takes what the eager model takes."""

    def providers(self, device: torch.device) -> list[str]:
        return []


#: Every engine by name, in the order they are tried.
COMPILER_REGISTRY: Registry[BaseCompiler] = Registry(
    "compiler", key=lambda c: c.name, entry_points="proftune.compilers")
#: Every engine object and the ``--compile`` names, read from the registry on each use.
COMPILERS = LiveSequence(lambda: tuple(COMPILER_REGISTRY.values()))
COMPILER_NAMES = LiveSequence(lambda: COMPILER_REGISTRY.names())

C = TypeVar("C")


def register_compiler(compiler: C) -> C:
    """Register a :class:`BaseCompiler` subclass (built with no arguments) or instance; usable as
    a class decorator. Its ``name`` is then a ``--compile`` engine."""
    obj: Any = compiler() if isinstance(compiler, type) else compiler
    if not isinstance(obj, BaseCompiler):
        raise ConfigError(f"compiler={compiler!r} is not a proftune.compress.BaseCompiler.")
    p = ProblemCollector()
    label = type(obj).__name__
    name, fmt, suffix = (getattr(obj, a, None) for a in ("name", "save_format", "suffix"))
    if not isinstance(name, str) or not name or "," in name:
        p.add(f"{label}.name must be a non-empty string without ',', but got {name!r}.")
    if not isinstance(suffix, str) or not suffix.startswith("."):
        p.add(f"{label}.suffix must be a file suffix such as '.onnx', but got {suffix!r}.")
    if not isinstance(fmt, str) or not fmt:
        p.add(f"{label}.save_format must be a non-empty string, but got {fmt!r}.")
    elif fmt not in LOAD_LINES and not isinstance(obj.load_line, str):
        p.add(f"{label}.save_format={fmt!r} has no load line; give {label}.load_line "
              f"(or one of {', '.join(LOAD_LINES)}).")
    if p.problems:
        raise ConfigError(p.problems)
    COMPILER_REGISTRY.add(obj, origin=compiler)
    return compiler


COMPILER_REGISTRY.loads_through(register_compiler)


def load_line_of(fmt: str) -> str:
    """The line that loads a file of format ``fmt``: ``LOAD_LINES``, else its compiler's own."""
    if fmt in LOAD_LINES:
        return LOAD_LINES[fmt]
    line = next((c.load_line for c in COMPILERS if c.save_format == fmt and c.load_line), None)
    if line is None:
        raise ConfigError(f"format={fmt!r} has no load line; valid: {', '.join(LOAD_LINES)}.")
    return line


class _Compiled(nn.Module):
    """A compiled program behind ``nn.Module``: ``.train()``/``.eval()`` only set the flag and
    ``.to()`` is a no-op (it runs where it was compiled for)."""

    def train(self, mode: bool = True) -> _Compiled:
        self.training = mode
        return self

    def _apply(self, fn: Any, recurse: bool = True) -> _Compiled:
        return self


class _Package(_Compiled):
    """An AOTInductor package behind ``nn.Module``."""

    def __init__(self, runner: Any) -> None:
        super().__init__()
        self.runner = runner

    def forward(self, *args: Any) -> Any:
        return self.runner(*args)


@register_compiler
class InductorAOT(BaseCompiler):
    name = "inductor"
    save_format = "aoti"
    suffix = ".pt2"

    def unavailable(self, device: torch.device) -> str | None:
        if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
            return "AOTInductor compiles C++ on CPU and no C++ compiler (g++, c++, clang++) is on PATH"
        if not hasattr(torch, "_inductor") or not hasattr(torch._inductor, "aoti_compile_and_package"):
            return f"this torch ({torch.__version__}) has no AOTInductor packaging (torch >= 2.6)"
        return None

    def compile(self, model: nn.Module, example: Any, path: Path, *, device: torch.device) -> None:
        args = example_args(example)
        with _quiet(), torch.no_grad():
            program = torch.export.export(model, args, dynamic_shapes=_dynamic(args))
            torch._inductor.aoti_compile_and_package(program, package_path=str(path))

    def load(self, path: Path, *, device: torch.device, threads: int | None) -> nn.Module:
        with _quiet():
            return _Package(torch._inductor.aoti_load_package(str(path))).eval()


class OrtModule(_Compiled):
    """An ONNX Runtime session behind ``nn.Module``: tensors in, tensors out (on the inputs' device)."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self.input_names = [i.name for i in session.get_inputs()]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        named = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor) and k in self.input_names}
        first = tensors or list(named.values())
        device = first[0].device if first else torch.device("cpu")
        feed = {n: a.detach().cpu().numpy() for n, a in zip(self.input_names, tensors, strict=False)}
        feed.update({k: v.detach().cpu().numpy() for k, v in named.items()})
        outs = [torch.from_numpy(o).to(device) for o in self.session.run(None, feed)]
        return outs[0] if len(outs) == 1 else tuple(outs)


@register_compiler
class OnnxRuntime(BaseCompiler):
    name = "onnxruntime"
    save_format = "onnx"
    suffix = ".onnx"

    def unavailable(self, device: torch.device) -> str | None:
        missing = [m for m in ("onnx", "onnxruntime", "onnxscript") if importlib.util.find_spec(m) is None]
        if missing:
            return f"{', '.join(missing)} not installed (pip install 'proftune[compile]')"
        return None

    def providers(self, device: torch.device) -> list[str]:
        import onnxruntime as ort

        have = ort.get_available_providers()
        wanted = ["TensorrtExecutionProvider", "CUDAExecutionProvider"] if device.type == "cuda" else []
        return [p for p in wanted if p in have] + ["CPUExecutionProvider"]

    def compile(self, model: nn.Module, example: Any, path: Path, *, device: torch.device) -> None:
        # one self-contained file (weights inside, not in a side .data file that a copy would lose);
        # protobuf caps it at 2 GB
        if isinstance(example, dict):  # keyword inputs (a Hugging Face model's input_ids=...): named so
            kwargs = dict(example)
            with _quiet(), torch.no_grad():
                torch.onnx.export(model, (), str(path), kwargs=kwargs, dynamo=True,
                                  dynamic_shapes={k: _dynamic((v,))[0] for k, v in kwargs.items()},
                                  input_names=list(kwargs), external_data=False)
            return
        args = example_args(example)
        with _quiet(), torch.no_grad():
            torch.onnx.export(model, args, str(path), dynamo=True, dynamic_shapes=_dynamic(args),
                              input_names=[f"input{i}" for i in range(len(args))], external_data=False)

    def load(self, path: Path, *, device: torch.device, threads: int | None) -> nn.Module:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: its warnings are C++ log lines on stderr
        if threads:
            options.intra_op_num_threads = int(threads)  # the same threads as torch's candidates
            options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=self.providers(device))
        return OrtModule(session).eval()


def get_compiler(name: str) -> BaseCompiler:
    """The engine called ``name`` (a ConfigError lists the valid ones)."""
    return COMPILER_REGISTRY.get_entry(name)


def compiler_status(device: torch.device) -> dict[str, str | None]:
    """For each engine, None when it can run on ``device``, else the reason it cannot."""
    return {c.name: c.unavailable(device) for c in COMPILERS}


def providers_of(module: nn.Module) -> list[str]:
    """The execution providers an :class:`OrtModule`'s session runs on (empty for anything else)."""
    if isinstance(module, OrtModule):
        return list(cast(Any, module.session).get_providers())
    return []
