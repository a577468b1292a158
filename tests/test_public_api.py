"""One object per public name: the six entry points are their subpackages, callable as their
function of the same name (``proftune.profile(task)``, ``import proftune.profile as m``,
``from proftune.profile import Profile`` all reach one module)."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pydoc
import sys
import types
from typing import Any
from unittest import mock

import pytest

import proftune

ENTRY_POINTS = ("profile", "compress", "search", "optimize", "recommend", "diagnose", "predict")


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_the_name_is_the_subpackage_and_calls_with_the_function_signature(name: str) -> None:
    module = importlib.import_module(f"proftune.{name}")
    function = module.__dict__[name]
    assert isinstance(module, types.ModuleType)
    assert getattr(proftune, name) is module
    assert inspect.isfunction(function)
    assert callable(module)
    assert inspect.signature(module) == inspect.signature(function)
    assert "store" in inspect.signature(module).parameters
    # help() shows the module, then how to call it and the function's own docstring
    doc = module.__doc__ or ""
    assert (inspect.getdoc(function) or "") in doc
    assert f"Called, ``proftune.{name}(" in doc
    assert f"proftune.{name}" in pydoc.render_doc(module)


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_import_as_gives_the_module(name: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"import proftune.{name} as m", namespace)  # IMPORT_NAME, then the attribute of proftune
    assert namespace["m"] is sys.modules[f"proftune.{name}"]
    assert namespace["m"].__all__


def test_calling_the_subpackage_calls_its_function_looked_up_each_time() -> None:
    from proftune import compress

    with mock.patch("proftune.compress.compress", return_value="compressed") as fake:
        assert compress("digits-mlp", quantize="dynamic") == "compressed"
    fake.assert_called_once_with("digits-mlp", quantize="dynamic")


def test_a_real_call_runs_the_function() -> None:
    p = proftune.profile("digits-mlp", batch_size=8, steps=1, detail="step", device="cpu")
    assert isinstance(p, proftune.Profile)
    assert p.params.total > 0


def test_the_subpackage_pickles_by_name_and_submodules_are_patchable() -> None:
    assert pickle.loads(pickle.dumps(proftune.profile)) is proftune.profile
    assert pickle.loads(pickle.dumps(proftune.search.search)) is proftune.search.search
    with mock.patch("proftune.profile._timing.LayerTimer") as fake:
        assert proftune.profile._timing.LayerTimer is fake


def test_the_function_carries_no_copy_of_the_subpackage() -> None:
    """The former hack set the subpackage's names on the function; now there is one object."""
    assert not hasattr(proftune.profile.profile, "Profile")
    assert proftune.profile.Profile is proftune.Profile
    assert proftune.compress.CompressConfig is proftune.CompressConfig
