"""The Task: the user's model, data, loss, optimizer and metric behind one small class.

Every command takes one. A task is named on the command line as ``path/to/file.py`` (its one
Task subclass), ``path/to/file.py:Class``, ``package.module:Class`` or a built-in name
(``proftune tasks`` lists them); :func:`load_task` turns any of these into an instance.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import torch
from torch import nn

from ._optimizers import build_optimizer
from .exceptions import TaskLoadError

__all__ = [
    "ClassificationTask",
    "Task",
    "TaskAdapter",
    "TaskWrapper",
    "absolute_spec",
    "builtin_task_names",
    "import_file",
    "load_task",
    "looks_like_script",
    "register_builtin_tasks",
    "register_task_adapter",
]


class Task:
    """Base class of a task. Subclass it and implement the four abstract methods.

    The base class keeps no state that its ``__init__`` must set, so a subclass may define its
    own ``__init__()`` without calling ``super().__init__()``. The class is built with no
    arguments.
    """

    #: Name shown in the run store and in ``proftune tasks``.
    name: ClassVar[str] = ""
    #: One line on what the task is.
    description: ClassVar[str] = ""
    #: Defaults for the params the fit loop understands (lr, batch_size, optimizer, ...).
    default_params: ClassVar[dict[str, Any]] = {}
    #: Epochs a plain ``proftune train TASK`` runs.
    default_epochs: ClassVar[int] = 5
    #: Directions of metrics that ``evaluate()`` returns under names the metric registry does
    #: not know (``{"bleu": "max"}``); see :mod:`proftune.metrics`.
    metric_directions: ClassVar[dict[str, str]] = {}

    # -- required -------------------------------------------------------------------------
    def build_model(self, params: dict[str, Any]) -> nn.Module:
        """Build a fresh model for ``params`` (the fit loop seeds the RNG first)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_model(params).")

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        """The training batches of one epoch, ``batch_size`` samples each."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement train_data(batch_size, params)."
        )

    def val_data(self, batch_size: int) -> Iterable[Any]:
        """The validation batches, in a fixed order."""
        raise NotImplementedError(f"{type(self).__name__} must implement val_data(batch_size).")

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """A scalar loss of ``model`` on ``batch``."""
        raise NotImplementedError(f"{type(self).__name__} must implement loss(model, batch).")

    # -- optional, with defaults ------------------------------------------------------------
    def evaluate(self, model: nn.Module, data: Iterable[Any]) -> dict[str, float]:
        """Metrics of ``model`` on ``data``; the default is the sample-weighted mean loss."""
        from ._device import batch_size_of

        total, count = 0.0, 0
        for batch in data:
            n = batch_size_of(batch)
            total += float(self.loss(model, batch)) * n
            count += n
        return {"val_loss": total / max(count, 1)}

    def test_data(self, batch_size: int) -> Iterable[Any] | None:
        """Held-out batches that nothing selects on, in a fixed order; None (the default): the task
        has none, and ``optimize`` selects on all of ``val_data`` and reports its race's rounds on
        other partitions (:meth:`resplit`) or an estimate corrected for the winner's curse."""
        return None

    def resplit(self, index: int) -> Task | None:
        """This task with another partition of its training and validation samples: partition
        ``index`` (1, 2, ...) of the pooled samples into sets of the task's own sizes, seeded by
        ``index`` (0 is the task itself). ``optimize``'s final race trains and judges each round on
        its own partition where validation is small, so its decision rests on more of the data
        than the one split the search chose on. None (the default): the two sets differ in kind
        (noisy or augmented training data, validation drawn elsewhere) and the task has its one
        split. :func:`proftune.examples.resplit_tensors` makes the partition for tensors."""
        return None

    def configure_optimizer(self, model: nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        """The optimizer named by ``params["optimizer"]`` (default AdamW, lr 1e-3)."""
        return build_optimizer(model.parameters(), params)

    def configure_scheduler(self, optimizer: torch.optim.Optimizer, params: dict[str, Any], *,
                            epochs: int | None, max_steps: int | None) -> Any:
        """A learning-rate schedule for the run's ``epochs`` and ``max_steps`` (either may be None).

        Return a ``torch.optim.lr_scheduler`` scheduler, which the fit loop steps after every
        optimizer step (the default interval), or ``{"scheduler": s, "interval": "epoch"}`` to
        step it once per epoch, after the epoch's evaluation (Lightning's default; a
        ``ReduceLROnPlateau`` needs it, and ``"monitor"``, the metric it watches, default
        ``val_loss``). A per-step scheduler whose counts read as epochs (``StepLR(step_size=2)``
        over a 5-epoch run) warns once; ``"interval": "step"`` says per step is meant. None (the
        default): the rate stays as the optimizer has it."""
        return None

    def example_batch(self, batch_size: int) -> Any:
        """One batch for profiling; the default is the first batch of ``train_data``."""
        params = dict(self.default_params)
        for batch in self.train_data(batch_size, params):
            return batch
        raise TaskLoadError(f"{type(self).__name__}.train_data({batch_size}) yielded no batch.")


class ClassificationTask(Task):
    """A task whose batches are ``(inputs, labels)`` and whose model returns logits.

    Gives cross-entropy as the loss and ``{"val_loss", "accuracy"}`` as the metrics.
    """

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)

    def evaluate(self, model: nn.Module, data: Iterable[Any]) -> dict[str, float]:
        total, correct, count = 0.0, 0, 0
        for x, y in data:
            logits = model(x)
            total += float(nn.functional.cross_entropy(logits.float(), y, reduction="sum"))
            correct += int((logits.argmax(dim=-1) == y).sum())
            count += int(y.shape[0])
        return {"val_loss": total / max(count, 1), "accuracy": correct / max(count, 1)}


class TaskWrapper(Task):
    """A task that changes one part of ``inner`` and delegates everything else to it.

    Every method of :class:`Task` calls ``inner``'s; every class attribute that :class:`Task`
    declares (``name``, ``default_params``, ``default_epochs``, ``metric_directions``, ...) is
    ``inner``'s, and so is any other attribute the wrapper does not have itself. A subclass
    overrides what it changes and may set its own ``name`` after ``super().__init__(inner)``.
    """

    def __init__(self, inner: Task) -> None:
        self.inner = inner
        for attr in _TASK_ATTRIBUTES:
            setattr(self, attr, getattr(inner, attr))

    def __getattr__(self, name: str) -> Any:
        # only reached for what neither the wrapper nor Task has: the inner task's own attributes
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return self.inner.build_model(params)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        return self.inner.train_data(batch_size, params)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        return self.inner.val_data(batch_size)

    def test_data(self, batch_size: int) -> Iterable[Any] | None:
        return self.inner.test_data(batch_size)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return self.inner.loss(model, batch)

    def evaluate(self, model: nn.Module, data: Iterable[Any]) -> dict[str, float]:
        return self.inner.evaluate(model, data)

    def configure_optimizer(self, model: nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        return self.inner.configure_optimizer(model, params)

    def configure_scheduler(self, optimizer: torch.optim.Optimizer, params: dict[str, Any], *,
                            epochs: int | None, max_steps: int | None) -> Any:
        return self.inner.configure_scheduler(optimizer, params, epochs=epochs, max_steps=max_steps)

    def example_batch(self, batch_size: int) -> Any:
        return self.inner.example_batch(batch_size)

    def resplit(self, index: int) -> Task | None:
        """``inner``'s partition ``index`` in this wrapper, where the wrapper leaves the data as
        ``inner`` has it; None where it changes them (a held-out part of validation, other
        batches): a partition of ``inner``'s samples would not be this task's."""
        data = ("train_data", "val_data", "test_data")
        if index == 0:
            return self
        if any(getattr(type(self), m) is not getattr(TaskWrapper, m) for m in data):
            return None
        inner = self.inner.resplit(index)
        if inner is None:
            return None
        other = copy.copy(self)
        other.inner = inner
        return other


#: The data attributes a Task declares on its class; a TaskWrapper takes each from its inner task.
_TASK_ATTRIBUTES = tuple(
    n for n, v in vars(Task).items() if not n.startswith("_") and not callable(v)
)


# -- loading ----------------------------------------------------------------------------------

_SPEC_FORMS = ("a file 'path/to/task.py', 'path/to/task.py:Class', 'package.module:Class', 'timm:MODEL' "
               "or a built-in name")


@dataclass(frozen=True)
class TaskAdapter:
    """What :func:`load_task` turns into a Task besides Task subclasses, registered by the package
    that knows it (:mod:`proftune.integrations`: a LightningModule, a Hugging Face model, a bare
    ``nn.Module``, ``timm:NAME``), so this module imports none of them.

    ``prefixes``: spec forms of the adapter's own, each prefix to its loader (``"timm:"`` ->
    ``loader("timm:resnet18")``). ``from_object(obj, origin=spec)``: a Task for an object that is
    not one (a class, instance or factory), or None. ``from_namespace(namespace, module_name,
    class_name, spec=spec)``: a Task from a user file's names when it defines no Task subclass
    (or not the one ``class_name`` names), or None.
    """

    name: str
    prefixes: Mapping[str, Callable[[str], Task]] = field(default_factory=dict)
    from_object: Callable[..., Task | None] | None = None
    from_namespace: Callable[..., Task | None] | None = None


#: The registered adapters by name, tried in registration order; filled by proftune.integrations.
_ADAPTERS: dict[str, TaskAdapter] = {}
#: Built-in task names to their "module:Class"; filled by proftune.examples.
_BUILTINS: dict[str, str] = {}


def register_task_adapter(adapter: TaskAdapter) -> None:
    """Let :func:`load_task` take what ``adapter`` knows; one of the same name is replaced."""
    _ADAPTERS[adapter.name] = adapter


def register_builtin_tasks(targets: Mapping[str, str]) -> None:
    """Make each name a task spec of its own: ``{"digits-mlp": "package.module:Class"}``."""
    _BUILTINS.update(targets)


def builtin_task_names() -> list[str]:
    """The built-in task names :func:`load_task` takes, sorted."""
    return sorted(_BUILTINS)


def _prefix_loader(spec: str) -> Callable[[str], Task] | None:
    for adapter in _ADAPTERS.values():
        for prefix, loader in adapter.prefixes.items():
            if spec.startswith(prefix):
                return loader
    return None


def load_task(spec: str | Task | type[Task]) -> Task:
    """Turn a task spec (or a Task class or instance) into a Task instance.

    Raises :class:`TaskLoadError` naming the problem: a missing file, a file with no Task
    subclass, several without ``:Class``, an import error (with the user's own failing line).
    """
    if isinstance(spec, Task):
        return spec
    if inspect.isclass(spec) and issubclass(spec, Task):
        return _instantiate(spec, origin=spec.__qualname__)
    if not isinstance(spec, str) and (foreign := _foreign(spec, origin=repr(spec))) is not None:
        return foreign
    if not isinstance(spec, str) or not spec.strip():
        raise TaskLoadError(f"task={spec!r} is not a task spec; give {_SPEC_FORMS}.")
    spec = spec.strip()
    if (loader := _prefix_loader(spec)) is not None:  # an adapter's own form: timm:MODEL
        return loader(spec)
    if spec in _BUILTINS:
        module_name, builtin_class = _BUILTINS[spec].split(":")
        cls = getattr(importlib.import_module(module_name), builtin_class)
        return _instantiate(cls, origin=spec)

    path_part, class_name = _split_spec(spec)
    if _names_a_file(path_part):
        return _load_from_file(Path(path_part), class_name, spec)
    if class_name is not None:
        return _load_from_module(path_part, class_name, spec)
    raise TaskLoadError(
        f"task {spec!r} is not a built-in task, a file or 'package.module:Class'. "
        f"Built-in tasks: {', '.join(builtin_task_names())}. Valid forms: {_SPEC_FORMS}."
    )


def absolute_spec(spec: str) -> str:
    """``spec`` as a process in another working directory (a Ray trial) loads it: a task file's
    path made absolute (``tasks/mine.py:Mine`` -> ``/home/me/proj/tasks/mine.py:Mine``); a
    built-in name, ``timm:MODEL`` and ``package.module:Class`` stay as they are."""
    spec = spec.strip()
    if _prefix_loader(spec) is not None or spec in _BUILTINS:
        return spec
    path_part, class_name = _split_spec(spec)
    if not _names_a_file(path_part):
        return spec
    path = str(Path(path_part).resolve())
    return f"{path}:{class_name}" if class_name else path


def _names_a_file(path_part: str) -> bool:
    return path_part.endswith(".py") or "/" in path_part or Path(path_part).exists()


def _split_spec(spec: str) -> tuple[str, str | None]:
    if ":" in spec:
        head, _, tail = spec.rpartition(":")
        if tail.isidentifier() and head:
            return head, tail
    return spec, None


def _load_from_file(path: Path, class_name: str | None, spec: str) -> Task:
    """Import a task file the way Python runs a script: the modules beside it are importable.

    A file inside a package (its folder has ``__init__.py``) is imported as part of that package,
    so its relative imports work; any other file runs with its folder on ``sys.path``.
    """
    if not path.exists():
        raise TaskLoadError(
            f"task file {str(path)!r} does not exist (looked for {path.resolve()}). "
            f"Give {_SPEC_FORMS}; built-in tasks: {', '.join(builtin_task_names())}."
        )
    if not path.is_file():
        raise TaskLoadError(f"task path {str(path)!r} is not a file; give a .py file that defines a Task.")
    resolved = path.resolve()
    if class_name is None and looks_like_script(resolved):
        raise TaskLoadError(
            f"{str(path)!r} is a script, not a task (it parses its arguments and defines no Task): importing it "
            f"would run its training. This is a script: use `proftune COMMAND -- python {path} ARGS` (its "
            "argparse flags are the params, its printed metric the objective).")
    try:
        module = import_file(resolved)
    except TaskLoadError:
        raise
    except Exception as exc:
        raise TaskLoadError(
            f"importing task file {str(path)!r} failed: {type(exc).__name__}: {exc}"
            + _user_frames(exc, resolved)
        ) from exc
    candidates = {
        name: obj
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, Task)
        and obj.__module__ == module.__name__
        and not name.startswith("_")
    }
    if (class_name not in candidates) if class_name else not candidates:
        foreign = _foreign(vars(module), origin=spec, module_name=module.__name__, class_name=class_name)
        if foreign is not None:
            return foreign
    return _pick_class(candidates, class_name, where=f"task file {str(path)!r}", spec=spec)


def looks_like_script(path: Path) -> bool:
    """Whether the file at ``path`` is a training script rather than a task file, read without running
    it: it calls ``parse_args``/``parse_known_args`` outside any function (at the top or under
    ``if __name__ == "__main__":``), or has that guard and imports argparse, and it defines no class
    on a ``*Task`` or ``LightningModule`` base (which the loader or an adapter takes)."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False  # the import says what is wrong
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(
                ast.unparse(b).endswith(("Task", "LightningModule")) for b in node.bases):
            return False

    def top_level(nodes: list[ast.stmt]) -> Iterable[ast.AST]:
        for n in nodes:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            yield from ast.walk(n)

    parses = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr in ("parse_args", "parse_known_args") for n in top_level(tree.body))
    guard = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)
    argparse_used = any(isinstance(n, (ast.Import, ast.ImportFrom)) and (
        any(a.name == "argparse" for a in n.names) or getattr(n, "module", None) == "argparse")
        for n in ast.walk(tree))
    return parses or (guard and argparse_used)


def import_file(path: Path) -> ModuleType:
    """The module of the file at ``path`` (absolute), imported as described in _load_from_file."""
    root = _package_root(path.parent)
    if root is not None:
        _put_on_path(root.parent)
        parts = [*path.parent.relative_to(root.parent).parts]
        if path.stem != "__init__":
            parts.append(path.stem)
        return importlib.import_module(".".join(parts))
    _put_on_path(path.parent)
    module_name = f"proftune_user_task_{abs(hash(str(path)))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise TaskLoadError(f"task file {str(path)!r} cannot be imported as Python.")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _package_root(folder: Path) -> Path | None:
    """The outermost package folder holding ``folder``, or None when ``folder`` is no package."""
    if not (folder / "__init__.py").is_file():
        return None
    while (folder.parent / "__init__.py").is_file() and folder.parent != folder:
        folder = folder.parent
    return folder


def _put_on_path(folder: Path) -> None:
    """Make the modules in ``folder`` importable, first, as ``python script.py`` does."""
    entry = str(folder)
    if entry not in sys.path:
        sys.path.insert(0, entry)
    importlib.invalidate_caches()


def _load_from_module(module_path: str, class_name: str, spec: str) -> Task:
    try:
        module = importlib.import_module(module_path)
    except Exception as exc:
        raise TaskLoadError(
            f"importing module {module_path!r} for task {spec!r} failed: "
            f"{type(exc).__name__}: {exc}" + _user_frames(exc, None)
        ) from exc
    obj = getattr(module, class_name, None)
    if obj is None:
        raise TaskLoadError(f"module {module_path!r} has no attribute {class_name!r} (task {spec!r}).")
    if not (inspect.isclass(obj) and issubclass(obj, Task)):
        if (foreign := _foreign(obj, origin=spec)) is not None:
            return foreign
        raise TaskLoadError(f"{spec!r} is {obj!r}, not a subclass of proftune.Task.")
    return _instantiate(obj, origin=spec)


def _pick_class(candidates: dict[str, type[Task]], class_name: str | None, *, where: str, spec: str) -> Task:
    if class_name is not None:
        if class_name not in candidates:
            found = ", ".join(sorted(candidates)) or "none"
            raise TaskLoadError(
                f"{where} has no Task subclass named {class_name!r}; Task subclasses found: {found}."
            )
        return _instantiate(candidates[class_name], origin=spec)
    if not candidates:
        raise TaskLoadError(
            f"{where} defines no subclass of proftune.Task; define one "
            "(class MyTask(proftune.Task): ...) or name a class with 'file.py:Class'."
        )
    if len(candidates) > 1:
        names = ", ".join(sorted(candidates))
        raise TaskLoadError(
            f"{where} defines several Task subclasses ({names}); pick one with "
            f"'{spec}:{sorted(candidates)[0]}'."
        )
    (cls,) = candidates.values()
    return _instantiate(cls, origin=spec)


def _foreign(obj: Any, *, origin: str, module_name: str | None = None, class_name: str | None = None) -> Task | None:
    """What the registered adapters make of what is not a Task (a LightningModule's class,
    instance or factory), the first one's Task; None when none takes it.

    ``module_name`` set: ``obj`` is a user file's namespace, searched for what ``class_name`` names.
    """
    for adapter in list(_ADAPTERS.values()):
        if module_name is not None:
            found = (adapter.from_namespace(obj, module_name, class_name, spec=origin)
                     if adapter.from_namespace is not None else None)
        else:
            found = adapter.from_object(obj, origin=origin) if adapter.from_object is not None else None
        if found is not None:
            return found
    return None


def _instantiate(cls: type[Task], *, origin: str) -> Task:
    try:
        return cls()
    except Exception as exc:
        raise TaskLoadError(
            f"building task {origin!r} ({cls.__qualname__}()) failed: {type(exc).__name__}: {exc}"
            + _user_frames(exc, None)
        ) from exc


def _user_frames(exc: BaseException, path: Path | None) -> str:
    """The failing lines from the user's code (not proftune's, not the import machinery's)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        line = (exc.text or "").rstrip()
        return f"\n  File {exc.filename!r}, line {exc.lineno}\n    {line.strip()}"
    own = str(Path(__file__).resolve().parent)
    keep = [
        f
        for f in frames
        if not f.filename.startswith(own) and "importlib" not in f.filename and "<frozen" not in f.filename
    ]
    if path is not None:
        in_file = [f for f in keep if Path(f.filename).resolve() == path]
        keep = in_file or keep
    if not keep:
        return ""
    f = keep[-1]
    return f"\n  File {f.filename!r}, line {f.lineno}, in {f.name}\n    {(f.line or '').strip()}"
