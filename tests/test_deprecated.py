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
