"""Each thing has one name; the former ones still work, with a DeprecationWarning naming the
current one (result kinds renamed, and constants that had one name for two meanings)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import proftune


@pytest.mark.parametrize(("module", "former", "current"), [
    ("proftune", "TrainReport", "TrainResult"),
    ("proftune", "DiagnoseReport", "DiagnoseResult"),
    ("proftune.diagnose", "DiagnoseReport", "DiagnoseResult"),
    ("proftune.diagnose", "BanditReport", "BanditResult"),
    ("proftune", "CompressReport", "CompressResult"),
    ("proftune.compress", "CompressReport", "CompressResult"),
    # one name, two meanings: each meaning has its own name now
    ("proftune.metrics", "STAGES", "METRIC_STAGES"),  # the stages that produce metrics
    ("proftune.optimize", "STAGES", "OPTIMIZE_STAGES"),  # the optimize loop's stages
    ("proftune.optimize", "GOALS", "OPTIMIZE_GOALS"),  # compress's goals map to metrics privately
    ("proftune.search", "BACKENDS", "SEARCH_BACKENDS"),  # where trials run: local, ray
    ("proftune.compress", "BACKENDS", "QUANT_BACKENDS"),  # the quantization backend objects
    ("proftune.search", "scan", "feasibility_scan"),  # beside search(scan=N) and SearchResult.scan
])
def test_a_former_name_warns_and_is_the_same_object(module: str, former: str, current: str) -> None:
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{module}.{former} is deprecated; use {module}.{current} "):
        assert getattr(mod, former) is getattr(mod, current)
    assert former not in mod.__all__
    assert current in mod.__all__


def test_the_two_meanings_are_two_objects() -> None:
    from proftune.compress import QUANT_BACKENDS, BaseQuantBackend
    from proftune.metrics import METRIC_STAGES
    from proftune.optimize import OPTIMIZE_STAGES
    from proftune.search import SEARCH_BACKENDS

    assert set(METRIC_STAGES).isdisjoint(OPTIMIZE_STAGES)
    assert SEARCH_BACKENDS == ("local", "ray")
    assert all(isinstance(b, BaseQuantBackend) for b in QUANT_BACKENDS)


def test_other_names_are_still_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="no attribute 'TrainReports'"):
        _ = proftune.TrainReports  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no attribute 'STAGE'"):
        _ = proftune.metrics.STAGE  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["predict", "PredictResult", "PredictConfig", "MemoryModel", "fit_memory_model",
                                  "DeviceSpec", "resolve_target", "DEVICES", "StepTracer"])
def test_a_name_moved_to_predict_warns_and_is_the_same_object(name: str) -> None:
    """The models of cost moved from proftune.recommend to proftune.predict, unrenamed."""
    recommend, home = importlib.import_module("proftune.recommend"), importlib.import_module("proftune.predict")
    with pytest.warns(DeprecationWarning,
                      match=f"proftune.recommend.{name} is deprecated; use proftune.predict.{name}"):
        assert getattr(recommend, name) is getattr(home, name)
    assert name not in recommend.__all__
    assert name in home.__all__


def test_metric_producers_is_stages_with_a_warning() -> None:
    """``Metric.producer`` is the function; the stages it runs in are ``Metric.stages``."""
    from proftune.metrics import get_metric

    m = get_metric("latency_ms")
    assert m.stages == ("inference",)
    with pytest.warns(DeprecationWarning, match=r"Metric.producers is deprecated; use Metric.stages"):
        assert m.producers == m.stages


def test_a_former_name_says_when_it_was_deprecated_and_when_it_goes() -> None:
    from proftune._deprecated import DEPRECATED_IN, removal_version

    with pytest.warns(DeprecationWarning, match="TrainReport") as w:
        _ = proftune.TrainReport  # type: ignore[attr-defined]
    text = str(w[0].message)
    assert f"Deprecated in {DEPRECATED_IN}, to be removed in {removal_version(DEPRECATED_IN)}." in text
    assert removal_version("0.1.0") == "0.3.0"
    assert removal_version("1.9.2") == "1.11.0"


def test_experimental_warns_once_naming_its_version() -> None:
    import warnings

    from proftune._deprecated import ExperimentalWarning, experimental

    @experimental("0.2.0")
    def plan(x: int) -> int:
        return x + 1

    @experimental("0.2.0", name="Planner")
    class Planner:
        def __init__(self, n: int) -> None:
            self.n = n

    with pytest.warns(ExperimentalWarning, match=r"plan is experimental \(since 0\.2\.0\)"):
        assert plan(1) == 2
    with pytest.warns(ExperimentalWarning, match=r"Planner is experimental"):
        assert Planner(3).n == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan(2) == 3  # once only
        assert Planner(4).n == 4
    assert plan.__name__ == "plan"


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each experimental interface warns once per process: start from none having warned."""
    from proftune import _deprecated

    monkeypatch.setattr(_deprecated, "_WARNED", set())


@pytest.mark.usefixtures("fresh_warnings")
def test_new_api_of_this_round_is_marked_experimental_and_warns_once(tmp_path: Path) -> None:
    import warnings

    from proftune._deprecated import ExperimentalWarning

    space = {"params": {"x": {"type": "float", "low": -1.0, "high": 1.0}}}
    db = f"sqlite:///{tmp_path / 'p.db'}"
    with pytest.warns(ExperimentalWarning, match=r"plain objective .* experimental \(since 0\.1\.0\)") as w:
        proftune.search(lambda p: p["x"] ** 2, space, trials=2, store=db, reevaluate=0.0)
    assert w[0].filename == __file__  # the warning names the caller's line, not one of proftune's
    with pytest.warns(ExperimentalWarning, match=r"proftune\.watch is experimental \(since 0\.1\.0\)"):
        proftune.watch(every=10).stop()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        proftune.watch(every=10).stop()  # once only
        proftune.search(lambda p: p["x"] ** 2, space, trials=3, store=db, reevaluate=0.0)


@pytest.mark.usefixtures("fresh_warnings")
def test_the_cli_keeps_lifecycle_warnings_off_stderr_unless_debug(recwarn: pytest.WarningsRecorder) -> None:
    from proftune._deprecated import warn_deprecated, warn_experimental
    from proftune.cli._common import library_warnings

    with library_warnings(shown=False):
        warn_experimental("thing", "0.1.0")
        warn_deprecated("old", use="new")
    assert not recwarn.list
    with library_warnings(shown=True):  # --debug
        warn_experimental("other thing", "0.1.0")
        warn_deprecated("old", use="new")
    assert [type(w.message).__name__ for w in recwarn.list] == ["ExperimentalWarning", "DeprecationWarning"]
    assert str(recwarn.list[1].message) == ("old is deprecated; use new. Deprecated in 0.1.0, "
                                            "to be removed in 0.3.0.")
