"""The Task API and the loader: file, file:Class, pkg.mod:Class, built-in names, clear errors."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import proftune
from proftune.examples import BUILTIN_TASKS
from proftune.exceptions import TaskLoadError
from proftune.task import Task, TaskWrapper, absolute_spec

TASK_SRC = textwrap.dedent(
    """
    import torch
    import proftune
    from proftune.examples import TensorBatches

    X = torch.randn(32, 4)
    Y = (X.sum(dim=1) > 0).long()

    class Tiny(proftune.ClassificationTask):
        name = "tiny"
        def build_model(self, params):
            return torch.nn.Linear(4, 2)
        def train_data(self, batch_size, params):
            return TensorBatches(X, Y, batch_size, shuffle=True)
        def val_data(self, batch_size):
            return TensorBatches(X, Y, batch_size, shuffle=False)
    """
)


def test_builtin_names_load() -> None:
    for name in ("digits-mlp", "digits-cnn", "digits-transformer", "wine-mlp"):
        task = proftune.load_task(name)
        assert task.name == name
    assert "resnet18-synthetic" in BUILTIN_TASKS


def test_file_and_class_forms(tmp_path: Path) -> None:
    f = tmp_path / "mytask.py"
    f.write_text(TASK_SRC)
    assert proftune.load_task(str(f)).name == "tiny"
    assert proftune.load_task(f"{f}:Tiny").name == "tiny"


def test_absolute_spec_makes_a_task_file_loadable_from_another_folder(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "mine.py").write_text(TASK_SRC)
    monkeypatch.chdir(tmp_path)
    spec = absolute_spec("tasks/mine.py:Tiny")
    assert spec == f"{tmp_path.resolve() / 'tasks' / 'mine.py'}:Tiny"
    assert absolute_spec("tasks/mine.py") == str(tmp_path.resolve() / "tasks" / "mine.py")
    # names that are no files stay as they are
    for name in ("digits-mlp", "timm:resnet10t", "proftune.examples._wine:WineMLP"):
        assert absolute_spec(name) == name
    monkeypatch.chdir(tmp_path / "tasks")  # a Ray trial's own working directory, say
    assert type(proftune.load_task(spec)).__name__ == "Tiny"


def test_module_form() -> None:
    task = proftune.load_task("proftune.examples._digits:DigitsMLP")
    assert task.name == "digits-mlp"


def test_missing_file() -> None:
    with pytest.raises(TaskLoadError, match="does not exist"):
        proftune.load_task("no/such/file.py")


def test_file_without_task(tmp_path: Path) -> None:
    f = tmp_path / "empty.py"
    f.write_text("import torch\nX = 1\n")
    with pytest.raises(TaskLoadError, match=r"no subclass of proftune\.Task"):
        proftune.load_task(str(f))


def test_several_tasks_need_class(tmp_path: Path) -> None:
    f = tmp_path / "two.py"
    f.write_text(TASK_SRC + "\nclass Other(Tiny):\n    name = 'other'\n")
    with pytest.raises(TaskLoadError, match=r"several Task subclasses \(Other, Tiny\)"):
        proftune.load_task(str(f))
    assert proftune.load_task(f"{f}:Other").name == "other"


def test_import_error_shows_user_line(tmp_path: Path) -> None:
    f = tmp_path / "broken.py"
    f.write_text("import proftune\nvalue = 1\nboom = undefined_thing + value\n")
    with pytest.raises(TaskLoadError) as info:
        proftune.load_task(str(f))
    text = str(info.value)
    assert "NameError" in text
    assert "line 3" in text
    assert "boom = undefined_thing + value" in text


def test_unknown_name_lists_builtins() -> None:
    with pytest.raises(TaskLoadError, match="digits-cnn"):
        proftune.load_task("not-a-task")


def test_subclass_init_without_super() -> None:
    class Custom(proftune.ClassificationTask):
        def __init__(self) -> None:  # no super().__init__(): the base keeps no state
            self.hidden = 3

    assert proftune.load_task(Custom).hidden == 3


def test_split_is_fixed_and_disjoint() -> None:
    from proftune.examples._sklearn import load_split

    x_tr, _y_tr, x_va, _y_va = load_split("digits")
    assert x_tr.shape[0] + x_va.shape[0] == 1797
    assert x_va.shape[0] == 360
    # a cached second load and a fresh computation give the same split
    load_split.cache_clear()
    x_tr2, _, x_va2, _ = load_split("digits")
    assert (x_tr == x_tr2).all()
    assert (x_va == x_va2).all()


def _write_project(folder: Path, *, model_module: str, package: bool) -> Path:
    """A user's project: the model in one module, the task in ``task.py`` beside it."""
    folder.mkdir(parents=True)
    (folder / f"{model_module}.py").write_text(
        "import torch\n\nclass Net(torch.nn.Linear):\n    def __init__(self):\n        super().__init__(4, 2)\n"
    )
    how = f"from .{model_module} import Net" if package else f"from {model_module} import Net"
    (folder / "task.py").write_text(TASK_SRC.replace("import proftune\n", f"import proftune\n{how}\n", 1)
                                    .replace("return torch.nn.Linear(4, 2)", "return Net()"))
    if package:
        (folder / "__init__.py").write_text("")
    return folder / "task.py"


def test_task_file_imports_modules_beside_it(tmp_path: Path) -> None:
    path = _write_project(tmp_path / "proj", model_module="sibling_model_a1", package=False)
    task = proftune.load_task(str(path))
    model = task.build_model({})
    assert type(model).__name__ == "Net"
    assert type(model).__module__ == "sibling_model_a1"


def test_task_file_in_a_package_uses_relative_imports(tmp_path: Path) -> None:
    outer = tmp_path / "outer_pkg_b2"
    outer.mkdir()
    (outer / "__init__.py").write_text("")
    path = _write_project(outer / "proj", model_module="model", package=True)
    task = proftune.load_task(f"{path}:Tiny")
    assert type(task).__module__ == "outer_pkg_b2.proj.task"
    assert type(task.build_model({})).__module__ == "outer_pkg_b2.proj.model"


# -- wrappers delegate everything they do not change ---------------------------------------------


class _Recording(proftune.ClassificationTask):
    """A task that records which of its methods ran and declares every Task attribute."""

    name = "recording"
    description = "records its calls"
    default_params: ClassVar[dict[str, Any]] = {"lr": 0.5, "batch_size": 4}
    default_epochs = 7
    metric_directions: ClassVar[dict[str, str]] = {"bleu": "max"}

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.own_attribute = "the inner task's own"
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(8, 4, generator=g)
        self.y = (self.x.sum(dim=1) > 0).long()

    def build_model(self, params: dict[str, Any]) -> torch.nn.Module:
        self.calls.append("build_model")
        return torch.nn.Linear(4, 2)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        self.calls.append("train_data")
        return [(self.x[i : i + batch_size], self.y[i : i + batch_size]) for i in range(0, 8, batch_size)]

    def val_data(self, batch_size: int) -> Iterable[Any]:
        self.calls.append("val_data")
        return [(self.x, self.y)]

    def test_data(self, batch_size: int) -> Iterable[Any]:
        self.calls.append("test_data")
        return [(self.x[:4], self.y[:4])]

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        self.calls.append("loss")
        return super().loss(model, batch)

    def resplit(self, index: int) -> Task | None:
        self.calls.append("resplit")
        return None

    def evaluate(self, model: torch.nn.Module, data: Iterable[Any]) -> dict[str, float]:
        self.calls.append("evaluate")
        return super().evaluate(model, data)

    def configure_optimizer(self, model: torch.nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        self.calls.append("configure_optimizer")
        return torch.optim.SGD(model.parameters(), lr=0.1)

    def configure_scheduler(self, optimizer: torch.optim.Optimizer, params: dict[str, Any], *,
                            epochs: int | None, max_steps: int | None) -> Any:
        self.calls.append("configure_scheduler")
        return None

    def example_batch(self, batch_size: int) -> Any:
        self.calls.append("example_batch")
        return self.x[:batch_size], self.y[:batch_size]


def _wrappers() -> dict[str, Callable[[Task], Task]]:
    from proftune._holdout import HeldOutTask
    from proftune.compress import DistillationTask
    from proftune.recommend._full_batches import FullBatchTask

    return {
        "TaskWrapper": TaskWrapper,
        "FullBatchTask": FullBatchTask,
        "DistillationTask": lambda inner: DistillationTask(inner, torch.nn.Linear(4, 2)),
        "HeldOutTask": HeldOutTask,
    }


#: Methods a wrapper answers from another of the inner task's methods, by design.
_FROM = {("HeldOutTask", "test_data"): "val_data"}


def _no_grad(call: Callable[[], Any]) -> Any:
    with torch.no_grad():
        return call()


_MODEL = torch.nn.Linear(4, 2)
_BATCH = (torch.randn(4, 4), torch.tensor([0, 1, 0, 1]))
#: How to call each Task method; a method added to Task without an entry here fails the test.
_CALLS: dict[str, Callable[[Task], Any]] = {
    "build_model": lambda t: t.build_model({}),
    "train_data": lambda t: list(t.train_data(4, {})),
    "val_data": lambda t: list(t.val_data(4)),
    "test_data": lambda t: list(t.test_data(4) or []),
    "loss": lambda t: t.loss(_MODEL, _BATCH),
    "evaluate": lambda t: _no_grad(lambda: t.evaluate(_MODEL, [_BATCH])),
    "configure_optimizer": lambda t: t.configure_optimizer(_MODEL, {}),
    "configure_scheduler": lambda t: t.configure_scheduler(torch.optim.SGD(_MODEL.parameters(), lr=0.1), {},
                                                           epochs=1, max_steps=None),
    "example_batch": lambda t: t.example_batch(4),
    "resplit": lambda t: t.resplit(1),
}


def test_every_subclass_of_task_wrapper_is_covered() -> None:
    import proftune.compress
    import proftune.recommend  # noqa: F401  (loads every wrapper in the package)

    def subclasses(cls: type) -> set[str]:
        return {n for c in cls.__subclasses__() for n in (c.__name__, *subclasses(c))}

    found = {n for n in subclasses(TaskWrapper) if not n.startswith("_")}
    assert found <= set(_wrappers()), found - set(_wrappers())


@pytest.mark.parametrize("wrapper", sorted(_wrappers()))
def test_wrapper_delegates_every_task_method_and_attribute(wrapper: str) -> None:
    methods = [n for n, v in vars(Task).items() if callable(v) and not n.startswith("_")]
    attributes = [n for n, v in vars(Task).items() if not callable(v) and not n.startswith("_")]
    assert set(methods) == set(_CALLS), "a Task method has no entry in _CALLS"
    assert {"name", "default_params", "default_epochs", "metric_directions"} <= set(attributes)
    for method in methods:
        inner = _Recording()
        wrapped = _wrappers()[wrapper](inner)
        out = _CALLS[method](wrapped)
        if method == "resplit" and any(getattr(type(wrapped), m) is not getattr(TaskWrapper, m)
                                       for m in ("train_data", "val_data", "test_data")):
            assert out is None, f"{wrapper} changes the data, so a partition of the inner task's is not its own"
            continue
        reached = _FROM.get((wrapper, method), method)
        assert reached in inner.calls, f"{wrapper}.{method} does not reach the inner task"
    inner = _Recording()
    wrapped = _wrappers()[wrapper](inner)
    for attr in attributes:
        if attr == "name":
            assert inner.name in wrapped.name
        else:
            assert getattr(wrapped, attr) == getattr(inner, attr), attr
    assert wrapped.own_attribute == inner.own_attribute  # type: ignore[attr-defined]


def test_a_registered_adapter_extends_load_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """task.py knows its adapters only through the registry: a new one is one registration."""
    from proftune import task as task_module

    monkeypatch.setattr(task_module, "_ADAPTERS", dict(task_module._ADAPTERS))
    made: list[str] = []

    class Built(proftune.ClassificationTask):
        def build_model(self, params: dict[str, Any]) -> torch.nn.Module:
            return torch.nn.Linear(4, 2)

    def from_spec(spec: str) -> Task:
        made.append(spec)
        return Built()

    task_module.register_task_adapter(task_module.TaskAdapter(
        "mine", prefixes={"mine:": from_spec},
        from_object=lambda obj, *, origin: Built() if obj == 42 else None))
    assert isinstance(proftune.load_task("mine:model-a"), Built)
    assert made == ["mine:model-a"]
    assert isinstance(proftune.load_task(42), Built)  # type: ignore[arg-type]
    assert absolute_spec("mine:model-a") == "mine:model-a"  # its own form, not a file


def test_the_package_fills_the_registries() -> None:
    """proftune's __init__ imports examples/ and integrations/, which register themselves."""
    from proftune import task as task_module

    assert task_module.builtin_task_names() == sorted(BUILTIN_TASKS)
    assert "timm:" in task_module._ADAPTERS["integrations"].prefixes
