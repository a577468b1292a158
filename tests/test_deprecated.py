"""Each result kind has one name; the former ones still work, with a DeprecationWarning."""

from __future__ import annotations

import importlib

import pytest

import proftune
from proftune.diagnose import BanditResult, DiagnoseResult


@pytest.mark.parametrize(("module", "former", "current"), [
    ("proftune", "TrainReport", proftune.TrainResult),
    ("proftune", "DiagnoseReport", DiagnoseResult),
    ("proftune.diagnose", "DiagnoseReport", DiagnoseResult),
    ("proftune.diagnose", "BanditReport", BanditResult),
    ("proftune", "CompressReport", proftune.CompressResult),
    ("proftune.compress", "CompressReport", proftune.CompressResult),
])
def test_a_former_name_warns_and_is_the_same_class(module: str, former: str, current: type) -> None:
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{former} is deprecated; use {module}.{current.__name__}"):
        assert getattr(mod, former) is current
    assert former not in mod.__all__


def test_other_names_are_still_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="no attribute 'TrainReports'"):
        _ = proftune.TrainReports  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["predict", "PredictResult", "PredictConfig", "MemoryModel", "fit_memory_model",
                                  "DeviceSpec", "resolve_target", "DEVICES", "StepTracer"])
def test_a_name_moved_to_predict_warns_and_is_the_same_object(name: str) -> None:
    """The models of cost moved from proftune.recommend to proftune.predict, unrenamed."""
    recommend, home = importlib.import_module("proftune.recommend"), importlib.import_module("proftune.predict")
    with pytest.warns(DeprecationWarning, match=f"proftune.recommend.{name} is deprecated; use proftune.predict.{name}"):
        assert getattr(recommend, name) is getattr(home, name)
    assert name not in recommend.__all__
    assert name in home.__all__
