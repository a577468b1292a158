"""Saving and loading models without running code from the file.

A file a user hands us, or one we hand them, is loaded with ``torch.load(weights_only=True)``:
tensors and plain values only. A whole pickled module can run any code while it loads, so it is
read only when the caller says it trusts the file (``trust=True``; ``compress(trust_model=True)``).

Formats that :func:`save_model` writes (``LOAD_LINES`` has the documented line for each):

- ``state``: float models (baseline, pruned). A dict of plain values: the state dict, the
  layers' shape attributes (structured pruning changes them), and how to rebuild the model (the
  task spec and its params). :func:`load_model` builds the task's model, gives each layer the
  saved shapes and loads the state dict.
- ``torchscript``: ``torch.ao.quantization`` INT8 models (quantized FX graph modules do not
  survive pickling; TorchScript archives hold no Python code).
- ``export``: torchao INT8 models (tensor subclasses), a ``torch.export`` program; loaded behind
  :class:`ExportedModule` so that ``.eval()``, ``.train()`` and ``.to()`` work as on any module.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from .._paths import replacing
from ..exceptions import ConfigError

__all__ = [
    "FORMATS",
    "LOAD_LINES",
    "ExportedModule",
    "Rebuild",
    "example_args",
    "file_format",
    "load_model",
    "read_model",
    "runs_no_user_code",
    "save_model",
    "task_spec",
]

FORMATS = ("state", "torchscript", "export")
LOAD_LINES = {
    "state": "from proftune.compress import load_model; model = load_model({path!r}{task})",
    "torchscript": "model = torch.jit.load({path!r})",
    "export": "from proftune.compress import load_model; model = load_model({path!r}{task})",
    # compiled candidates (compress/_compile.py): run by their engine, not by load_model
    "onnx": ("import onnxruntime as ort; session = ort.InferenceSession({path!r}, "
             "providers=['CPUExecutionProvider']); outputs = session.run(None, {{'input0': x.numpy()}})"),
    "aoti": ("import torch; model = torch._inductor.aoti_load_package({path!r})  "
             "# native code compiled by proftune: load only packages you built or trust"),
}
_KIND = "proftune.compress/state"
_PRIMITIVES = (bool, int, float, str, type(None))
#: A layer's plain attribute (``in_features``, ``kernel_size``, ...) as a ``state`` file keeps it.
_Primitive = bool | int | float | str | None
_Plain = _Primitive | tuple[_Primitive, ...] | list[_Primitive]


@dataclass
class Rebuild:
    """How to rebuild a float model: the task spec (``None``: the loader must pass ``task=``)."""

    task: str | None
    params: dict[str, Any] = field(default_factory=dict)


class ExportedModule(nn.Module):
    """A ``torch.export`` program's module behind the switches user code calls on any model.

    The program was exported in eval mode and has no train/eval switch of its own (calling it
    raises); here ``.eval()`` and ``.train()`` only set the flag, ``.to()`` moves its weights.
    """

    def __init__(self, program_module: nn.Module) -> None:
        super().__init__()
        self.program = program_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.program(*args, **kwargs)

    def train(self, mode: bool = True) -> ExportedModule:
        self.training = mode
        return self


@contextlib.contextmanager
def _quiet_jit() -> Iterator[None]:
    """torch.jit warns that it is deprecated on every trace, save and load; it is still the one
    format that holds a torch.ao INT8 model, so the warning is noise to a user of proftune."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated", category=FutureWarning)
        yield


def task_spec(given: Any, task: Any) -> str | None:
    """A spec that loads ``task`` again (built-in name, absolute ``file.py:Class`` or
    ``module:Class``; a :class:`~proftune.task.TaskWrapper`'s inner task, which builds the
    model), or None when its class lives in ``__main__``."""
    if isinstance(given, str):
        head, sep, tail = given.rpartition(":")
        path_part = head if sep and tail.isidentifier() else given
        if Path(path_part).is_file():
            return str(Path(path_part).resolve()) + (f":{tail}" if path_part == head else "")
        return given
    from ..task import TaskWrapper

    while isinstance(task, TaskWrapper):  # a wrapper changes the data or the loss; the model is inner's
        task = task.inner
    cls = type(task)
    module = cls.__module__
    if module == "__main__":
        return None
    if module.startswith("proftune_user_task_") or module not in sys.modules:
        source = inspect.getsourcefile(cls)
        return f"{Path(source).resolve()}:{cls.__name__}" if source else None
    return f"{module}:{cls.__name__}"


def example_args(example: Any) -> tuple[Any, ...]:
    """A model's positional inputs: a tuple or list is its args, anything else the one arg."""
    return tuple(example) if isinstance(example, (tuple, list)) else (example,)


def _shape_attrs(model: nn.Module) -> dict[str, dict[str, _Plain]]:
    """Each layer's plain attributes (in_features, out_channels, num_features, ...)."""
    out: dict[str, dict[str, _Plain]] = {}
    for name, mod in model.named_modules():
        attrs = {k: v for k, v in vars(mod).items()
                 if k != "training" and not k.startswith("__") and _is_plain(v)}
        if attrs:
            out[name] = attrs
    return out


def _is_plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(isinstance(v, _PRIMITIVES) for v in value)
    return isinstance(value, _PRIMITIVES)


def save_model(model: nn.Module, path: str | Path, example: Any, *, fmt: str,
               rebuild: Rebuild | None = None) -> None:
    """Write ``model`` to ``path`` in ``fmt`` (see the module doc); the parent folder must exist.
    The file is written beside ``path`` and renamed over it (a link at ``path`` is replaced, not
    followed)."""
    if fmt not in FORMATS:
        raise ConfigError(f"fmt={fmt!r} is unknown; valid: {', '.join(FORMATS)}.")
    if fmt == "state" and rebuild is None:
        raise ConfigError("fmt='state' needs rebuild= (the task spec and params that build the model).")
    with replacing(path) as tmp:
        if fmt == "state":
            assert rebuild is not None
            torch.save({"kind": _KIND, "task": rebuild.task, "params": dict(rebuild.params),
                        "attrs": _shape_attrs(model),
                        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}}, tmp)
        elif fmt == "torchscript":
            with torch.no_grad(), _quiet_jit():
                if isinstance(example, dict):
                    scripted = torch.jit.trace(model, example_kwarg_inputs=dict(example), check_trace=False)
                else:
                    scripted = torch.jit.trace(model, example_args(example), check_trace=False)
                torch.jit.save(scripted, str(tmp))
        else:
            program = _export(model, example)
            with open(tmp, "wb") as f:  # a file object: any suffix (torch.export wants .pt2 for a path)
                torch.export.save(program, f)


def _export(model: nn.Module, example: Any) -> Any:
    """``torch.export`` with a dynamic batch dimension on every tensor input (args or kwargs)."""
    batch = torch.export.Dim.DYNAMIC

    def dyn(a: Any) -> Any:
        return {0: batch} if isinstance(a, torch.Tensor) and a.dim() > 0 else None

    if isinstance(example, dict):
        return torch.export.export(model, (), kwargs=dict(example),
                                   dynamic_shapes={k: dyn(v) for k, v in example.items()})
    args = example_args(example)
    return torch.export.export(model, args, dynamic_shapes=tuple(dyn(a) for a in args))


def file_format(path: str | Path) -> str:
    """Which of :data:`FORMATS` a saved file is, from the archive's entries (``state`` also
    stands for any other ``torch.save`` file: a state dict, or a pickled module)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError):
        return "state"  # a legacy (non-zip) torch.save file, or not a checkpoint at all
    # a pt2 archive's models/ sits under its root; TorchScript's code/__torch__/timm/models/ does not
    if any(n.endswith("serialized_exported_program.json") or n.split("/")[1:2] == ["models"] for n in names):
        return "export"
    if any(n.endswith("constants.pkl") for n in names) and any("/code/" in n for n in names):
        return "torchscript"
    return "state"


def _torch_load(path: Path, *, trust: bool, name: str, trust_name: str) -> Any:
    """``torch.load`` with weights only; a pickled module only with ``trust`` (the caller's
    argument for it is ``trust_name``, which the message names)."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # the weights-only unpickler fails on a non-checkpoint with any error
        # only the refused class's name: torch's own advice (weights_only=False, add_safe_globals)
        # is the code-running load that proftune offers as an explicit trust switch instead
        found = re.search(r"GLOBAL\s+([\w.]+)", str(exc))
        if found is None:  # no class reference refused: the bytes are not a torch.save file
            raise _not_a_checkpoint(path, name, trust_name, exc) from exc
        if not trust:
            raise ConfigError(
                f"{name}={str(path)!r} holds a whole pickled model (class {found.group(1)}), not just weights: "
                "loading it runs code stored in the file. Load it only if you trust where it came "
                f"from ({trust_name}=True), or save the weights with "
                "torch.save(model.state_dict(), path) and pass that file."
            ) from None
    try:
        return torch.load(path, weights_only=False, map_location="cpu")
    except Exception as exc:  # a trusted file that still does not unpickle: say what it should be
        raise _not_a_checkpoint(path, name, trust_name, exc) from exc


def _why(exc: BaseException) -> str:
    """torch's reason a file did not load, without its advice to load with ``weights_only=False``
    (the code-running load, which proftune offers only as an explicit trust switch)."""
    text = str(exc)
    found = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    line = found.group(1) if found else (text.splitlines()[0] if text else "")
    kept = [s for s in re.split(r"(?<=[.!?])\s+", line.strip()) if "weights_only" not in s]
    return " ".join(kept)


def _not_a_checkpoint(path: Path, name: str, trust_name: str, exc: BaseException) -> ConfigError:
    first = _why(exc)
    return ConfigError(
        f"{name}={str(path)!r} is not a PyTorch checkpoint ({type(exc).__name__}: {first}); expected a "
        "file written by torch.save(model.state_dict(), path), by proftune compress, or (with "
        f"{trust_name}=True) by torch.save(model, path)."
    )


def _reshape_to(model: nn.Module, state: dict[str, torch.Tensor], attrs: dict[str, dict[str, _Plain]]) -> None:
    """Give each layer the saved shapes (a structurally pruned model has fewer channels)."""
    modules = dict(model.named_modules())
    for key, tensor in state.items():
        owner, _, local = key.rpartition(".")
        mod = modules.get(owner)
        if mod is None:
            continue
        current = mod._parameters.get(local) if local in mod._parameters else mod._buffers.get(local)
        if current is None or current.shape == tensor.shape:
            continue
        fresh = torch.empty(tensor.shape, dtype=current.dtype, device=current.device)
        if local in mod._parameters:
            mod._parameters[local] = nn.Parameter(fresh, requires_grad=current.requires_grad)
        else:
            mod._buffers[local] = fresh
    for name, values in attrs.items():
        mod = modules.get(name)
        if mod is not None:
            for k, v in values.items():
                if k in vars(mod):
                    setattr(mod, k, tuple(v) if isinstance(v, list) else v)


def runs_no_user_code(spec: str | None) -> bool:
    """Whether building the task ``spec`` runs only proftune's and installed libraries' own
    code (a built-in task, ``timm:NAME``), not a file or module that a checkpoint could name."""
    from ..examples import BUILTIN_TASKS

    return isinstance(spec, str) and (spec in BUILTIN_TASKS or spec.startswith("timm:"))


def _rebuild(saved: dict[str, Any], task: Any, path: Path, name: str, *, trust: bool, trust_name: str) -> nn.Module:
    from ..task import load_task

    recorded = saved.get("task")
    if task is None and recorded is None:
        raise ConfigError(f"{name}={str(path)!r} does not record which task builds its model (its Task "
                          "class lived in __main__); pass task= to load_model.")
    if task is None and not trust and not runs_no_user_code(recorded):
        raise ConfigError(
            f"{name}={str(path)!r} names the task {recorded!r} to build its model, and building it would "
            "import that code: the file chose it. Name the task yourself (load_model(path, "
            f"task={recorded!r}) if it is the one you mean), or pass {trust_name}=True if you trust the file.")
    task_obj = load_task(task if task is not None else str(recorded))
    model = task_obj.build_model(dict(saved.get("params") or {}))
    _reshape_to(model, saved["state_dict"], saved.get("attrs") or {})
    try:
        model.load_state_dict(saved["state_dict"])
    except RuntimeError as exc:
        raise ConfigError(f"{name}={str(path)!r}: its weights do not fit the model that task "
                          f"{task_obj.name!r} builds: {exc}") from exc
    return model


def read_model(path: str | Path, *, task: Any = None, params: Mapping[str, Any] | None = None,
               trust: bool = False, name: str = "path", trust_name: str = "trust") -> nn.Module:
    """A float model from ``path``: a state dict for ``task.build_model(params)``, a ``state``
    file written by proftune, or (only with ``trust``) a whole pickled module. Messages name the
    file as the caller's argument ``name`` and the trust switch as its ``trust_name``
    (``compress(model=..., trust_model=True)``)."""
    path = Path(path)
    loaded = _torch_load(path, trust=trust, name=name, trust_name=trust_name)
    if isinstance(loaded, dict) and loaded.get("kind") == _KIND:
        return _rebuild(loaded, task, path, name, trust=trust, trust_name=trust_name)
    if isinstance(loaded, nn.Module):
        return loaded
    if isinstance(loaded, dict) and all(isinstance(v, torch.Tensor) for v in loaded.values()):
        if task is None:
            raise ConfigError(f"{name}={str(path)!r} is a state dict; pass task= (and params=) to "
                              "build the model it belongs to.")
        from ..task import load_task

        task_obj = load_task(task)
        model = task_obj.build_model(dict(params or {}))
        try:
            model.load_state_dict(loaded)
        except RuntimeError as exc:
            raise ConfigError(f"{name}={str(path)!r} is a state dict that does not fit "
                              f"{task_obj.name}'s model for these params: {exc}") from exc
        return model
    raise ConfigError(f"{name}={str(path)!r} holds a {type(loaded).__name__}; give a file saved with "
                      "torch.save(model.state_dict(), path).")


def load_model(path: str | Path, *, task: Any = None, params: Mapping[str, Any] | None = None,
               trust: bool = False) -> nn.Module:
    """Load a model saved by ``proftune compress`` (any of its formats), ready for inference.

    No code stored in the file runs, and none that it names: a ``state`` file is rebuilt through
    a task, weights loaded with ``weights_only=True``; the task it records is used as it is only
    when it is a built-in (or ``timm:NAME``), otherwise the caller names it (``task=``) or says
    it trusts the file (``trust=True``, which also allows a whole pickled module).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"path={str(path)!r} is not a file.")
    fmt = file_format(path)
    if fmt == "torchscript":
        with _quiet_jit():
            return cast(nn.Module, torch.jit.load(str(path), map_location="cpu"))
    if fmt == "export":
        with open(path, "rb") as f:
            return ExportedModule(torch.export.load(f).module()).eval()
    return read_model(path, task=task, params=params, trust=trust).eval()
