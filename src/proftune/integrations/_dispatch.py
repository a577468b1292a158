"""Turn what a task spec names, when it is not a proftune Task, into one.

:func:`proftune.load_task` asks :func:`foreign_task` and :func:`foreign_task_in` before it gives
up on a spec: a LightningModule class (with its LightningDataModule, if the file has one and the
module has no dataloaders of its own), a LightningModule instance or a function that returns one;
a Hugging Face model class, instance or factory (on random tokens: :class:`HFModelTask`); any
other ``nn.Module`` class, instance or factory, a timm model say (a classifier on synthetic data:
:class:`ModuleTask`).
:func:`task_with_data` is the CLI's ``--data``: a LightningModule with the LightningDataModule named apart.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..exceptions import ConfigError, TaskLoadError
from ..task import Task, absolute_spec, import_file

__all__ = ["foreign_task", "foreign_task_in", "resolve_object", "task_with_data"]


def _kind(obj: Any) -> str | None:
    from ._lightning_task import lightning_module_class

    return lightning_module_class(obj if inspect.isclass(obj) else type(obj))


def foreign_task(obj: Any, *, origin: str, datamodule: Any = None) -> Task | None:
    """A Task for ``obj`` (a LightningModule, Hugging Face model or other ``nn.Module``: class,
    instance or factory), or None if it is none."""
    if obj is None:
        return None
    kind = _kind(obj)
    if kind == "module":
        from ._lightning_task import LightningTask

        if inspect.isclass(obj):
            return LightningTask(obj, datamodule, name=obj.__name__)
        template = obj  # an instance: every model proftune trains is a fresh copy of it
        return LightningTask(lambda: copy.deepcopy(template), datamodule, name=type(obj).__name__)
    from ._hf_task import HFModelTask, is_hf_model

    if is_hf_model(obj):
        if inspect.isclass(obj):  # built from its default config, random weights
            cls: Any = obj
            return HFModelTask(lambda: cls(cls.config_class()), name=cls.__name__)
        template = obj
        return HFModelTask(lambda: copy.deepcopy(template), name=type(obj).__name__)
    from ._module_task import ModuleTask, is_plain_module

    if kind is None and is_plain_module(obj):
        if inspect.isclass(obj):  # built without arguments
            module_cls: Any = obj
            return ModuleTask(lambda params: module_cls(), name=obj.__name__)
        module = obj
        return ModuleTask(lambda params: copy.deepcopy(module), name=type(obj).__name__)
    if kind is None and inspect.isfunction(obj):
        returns = _returns(obj)
        if returns is None and not inspect.signature(obj).parameters:
            returns = type(obj())  # a factory named explicitly, without a return annotation
        if _kind(returns) == "module":
            from ._lightning_task import LightningTask

            return LightningTask(obj, datamodule, name=obj.__name__)
        if returns is not None and is_hf_model(returns):
            return HFModelTask(obj, name=obj.__name__)
        if returns is not None and is_plain_module(returns) and _callable_bare(obj):
            factory = obj
            return ModuleTask(lambda params: factory(), name=obj.__name__)
    return None


def _callable_bare(fn: Any) -> bool:
    """Whether ``fn()`` is a valid call: every parameter has a default (timm's ``resnet18(pretrained=False,
    **kwargs)``)."""
    bare = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return all(p.default is not p.empty or p.kind in bare for p in inspect.signature(fn).parameters.values())


def _returns(fn: Any) -> Any:
    """The class a factory's return annotation names, if it resolves; else None."""
    try:
        hints = inspect.get_annotations(fn, eval_str=True)
    except (NameError, TypeError, SyntaxError):
        return None
    return hints.get("return")


def _defined(namespace: Mapping[str, object], module_name: str, kind: str) -> dict[str, type]:
    return {name: obj for name, obj in namespace.items()
            if inspect.isclass(obj) and getattr(obj, "__module__", None) == module_name
            and not name.startswith("_") and _kind(obj) == kind}


def foreign_task_in(namespace: Mapping[str, object], module_name: str, class_name: str | None,
                    *, spec: str) -> Task | None:
    """A Task from a module's namespace (a user's file): the LightningModule it names or defines.

    Without ``class_name`` the file must define exactly one LightningModule. A file that also
    defines exactly one LightningDataModule pairs it with a module that has no dataloaders.
    """
    modules = _defined(namespace, module_name, "module")
    if class_name is not None:
        obj = namespace.get(class_name)
    elif len(modules) == 1:
        (obj,) = modules.values()
    elif len(modules) > 1:
        names = ", ".join(sorted(modules))
        raise TaskLoadError(f"{spec!r} defines several LightningModules ({names}); pick one with "
                            f"'{spec}:{sorted(modules)[0]}'.")
    else:
        return None
    if obj is None or (_kind(obj) is None and not inspect.isfunction(obj) and not _is_hf(obj)
                       and not _is_module(obj)):
        return None
    datamodule = None
    dms = _defined(namespace, module_name, "datamodule")
    if len(dms) == 1 and not _has_own_loaders(obj):
        (datamodule,) = dms.values()
    return foreign_task(obj, origin=spec, datamodule=datamodule)


def _is_hf(obj: Any) -> bool:
    from ._hf_task import is_hf_model

    return is_hf_model(obj)


def _is_module(obj: Any) -> bool:
    from ._module_task import is_plain_module

    return is_plain_module(obj)


def _has_own_loaders(obj: Any) -> bool:
    if _kind(obj) != "module":
        return True  # a factory: its module's loaders are unknown until it is called
    from ._lightning_task import lightning_namespace

    cls = obj if inspect.isclass(obj) else type(obj)
    return getattr(cls, "train_dataloader", None) is not lightning_namespace().LightningModule.train_dataloader


def resolve_object(spec: str, *, what: str) -> Any:
    """The object ``file.py:Name`` or ``package.module:Name`` names (``file.py`` alone: its one
    LightningModule, or its one LightningDataModule when ``what`` is ``"data"``). ``what`` is the
    caller's argument that gave ``spec`` (``"task"``, ``"data"``): messages name it, ``data='x.py'``."""
    head, sep, name = spec.rpartition(":")
    if not sep or not name.isidentifier():
        head, name = spec, ""
    if head.endswith(".py") or "/" in head or Path(head).exists():
        path = Path(head)
        if not path.is_file():
            raise ConfigError(f"{what}={spec!r}: the file {head!r} does not exist (looked for {path.resolve()}).")
        resolved = path.resolve()
        # the module the task loader imported for this file, if it did: the same classes
        module_name = f"proftune_user_task_{abs(hash(str(resolved)))}"
        module = sys.modules.get(module_name)
        if module is None or getattr(module, "__file__", None) != str(resolved):
            try:
                module = import_file(resolved)
            except TaskLoadError:
                raise
            except Exception as exc:  # the user's code failed at import: say which file
                raise TaskLoadError(f"{what}={spec!r}: importing the file {head!r} failed: "
                                    f"{type(exc).__name__}: {exc}") from exc
            module_name = module.__name__
    elif name:
        try:
            module = importlib.import_module(head)
        except ImportError as exc:
            raise TaskLoadError(f"{what}={spec!r}: importing the module {head!r} failed: {exc}") from exc
        module_name = module.__name__
    else:
        raise ConfigError(f"{what}={spec!r} is neither 'file.py[:Class]' nor 'package.module:Class'.")
    if name:
        if not hasattr(module, name):
            raise ConfigError(f"{what}={spec!r}: {head!r} has no {name!r}.")
        return getattr(module, name)
    kind = "datamodule" if what == "data" else "module"
    found = _defined(vars(module), module_name, kind)
    if len(found) != 1:
        label = "LightningDataModule" if kind == "datamodule" else "LightningModule"
        raise ConfigError(f"{what}={spec!r} defines {len(found)} {label}s ({', '.join(sorted(found)) or 'none'}); "
                          f"name one with '{head}:Class'.")
    return next(iter(found.values()))


def task_with_data(task: str, data: str) -> Task:
    """The LightningModule ``task`` names, trained on the LightningDataModule ``data`` names
    (the CLI's ``TASK --data``)."""
    dm = resolve_object(data, what="data")
    if _kind(dm) != "datamodule":
        raise ConfigError(f"data={data!r} is {getattr(dm, '__name__', type(dm).__name__)}, not a "
                          "LightningDataModule (class or instance).")
    obj = resolve_object(task, what="task")
    from ._lightning_task import LightningTask

    adapted = foreign_task(obj, origin=task, datamodule=dm)
    if not isinstance(adapted, LightningTask):  # a proftune Task, a plain or Hugging Face module: not trained on it
        brings = ("a proftune Task brings its own data" if adapted is None
                  else f"{adapted.description} makes its own data")
        raise ConfigError(f"data= applies to a LightningModule task, but the task {task!r} is "
                          f"{getattr(obj, '__name__', type(obj).__name__)}; {brings}.")
    # another process (a Ray trial) rebuilds it from the files
    adapted.specs = (absolute_spec(task), absolute_spec(data))
    adapted.rebuild = task_with_data
    return adapted
