"""The Task API and the loader: file, file:Class, pkg.mod:Class, built-in names, clear errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import proftune
from proftune.examples import BUILTIN_TASKS
from proftune.exceptions import TaskLoadError

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
    assert "NameError" in text and "line 3" in text and "boom = undefined_thing + value" in text


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
    assert (x_tr == x_tr2).all() and (x_va == x_va2).all()


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
