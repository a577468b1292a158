"""Plug-ins as an installed package has them: a real ``*.dist-info`` with an ``entry_points.txt`` on
a fresh interpreter's ``sys.path``, for every kind.

The plug-in module both decorates its classes (``@register_sampler``, ...) and is named by the
entry points, the form ARCHITECTURE.md shows: each must register once. A second package's entry
points name parts that ``register_*`` refuses: they are refused the same way. A report page
replaces a built-in page, and a page of a new kind of run needs no edit of ``src/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

PLUGIN = '''
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import optuna
import torch
from torch import nn

from proftune import metrics
from proftune.compress import (BaseCompiler, BaseCompressMethod, BaseQuantBackend, register_compiler,
                               register_method, register_quant_backend)
from proftune.diagnose import BaseCheck, register_check
from proftune.optimize import BaseStage, StageOutputs, register_stage
from proftune.report import register_renderer
from proftune.search import (BasePrunerMaker, BaseSamplerMaker, BaseSearchBackend, register_backend,
                             register_pruner, register_sampler)
from proftune.search import SEARCH_BACKEND_REGISTRY


@register_sampler
class MyRandom(BaseSamplerMaker):
    name = "my-random"

    def make(self, settings: Any, *, seed: int) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=seed)


@register_pruner
class MyNever(BasePrunerMaker):
    name = "my-never"

    def make(self, options: dict[str, Any]) -> optuna.pruners.BasePruner:
        return optuna.pruners.NopPruner()


@register_backend
class MyBackend(BaseSearchBackend):
    name = "my-backend"

    def run(self, settings: Any, config: Any, **kw: Any) -> Any:
        return SEARCH_BACKEND_REGISTRY.get_entry("local").run(settings, config, **kw)


@dataclass(frozen=True)
class MyOutputs(StageOutputs):
    STAGE: ClassVar[str] = "my-stage"
    n: int = 0


@register_stage
class MyStage(BaseStage):
    name = "my-stage"
    share = 0.01
    record = MyOutputs
    after = "compute"

    def run(self, loop: Any, share: float, end: float) -> Any:
        raise NotImplementedError("not run in this test")


@register_check
class MyCheck(BaseCheck):
    cause = "my_cause"

    def check(self, history: Any) -> Any:
        return None


ENERGY = metrics.register_metric(metrics.Metric("my_energy_j", "min", "J", ("step",), "energy"))


@register_method
class MyMethod(BaseCompressMethod):
    name = "my-method"
    save_format = "state"

    def apply(self, model: nn.Module, context: Any) -> nn.Module:
        return model


@register_quant_backend
class MyQuant(BaseQuantBackend):
    name = "my-quant"
    method = "dynamic"
    save_format = "state"

    def unavailable(self, device: torch.device, model: nn.Module | None = None) -> str | None:
        return None

    def quantize(self, model: nn.Module, inputs: Any) -> nn.Module:
        return model


@register_compiler
class MyEngine(BaseCompiler):
    name = "my-engine"
    save_format = "state"
    suffix = ".pt"

    def unavailable(self, device: torch.device) -> str | None:
        return None

    def compile(self, model: nn.Module, example: Any, path: Any, *, device: torch.device) -> None:
        torch.save(model.state_dict(), path)

    def load(self, path: Any, *, device: torch.device, threads: int | None) -> nn.Module:
        raise NotImplementedError("not loaded in this test")


@register_renderer("train", replace=True)
def train_page(page: Any, run: Any, context: Any) -> None:
    page.section("MY TRAIN PAGE").para(f"run {run.id}")


def my_kind_page(page: Any, run: Any, context: Any) -> None:  # registered by its entry point only
    page.section("MY KIND PAGE").para(f"run {run.id}")


MY_KIND = "runs of my plug-in"
'''

ENTRY_POINTS = '''
[proftune.samplers]
my-random = my_plugins:MyRandom
[proftune.pruners]
my-never = my_plugins:MyNever
[proftune.search_backends]
my-backend = my_plugins:MyBackend
[proftune.optimize_stages]
my-stage = my_plugins:MyStage
[proftune.checks]
my_cause = my_plugins:MyCheck
[proftune.metrics]
my_energy_j = my_plugins:ENERGY
[proftune.compress_methods]
my-method = my_plugins:MyMethod
[proftune.quant_backends]
my-quant = my_plugins:MyQuant
[proftune.compilers]
my-engine = my_plugins:MyEngine
[proftune.report_pages]
train = my_plugins:train_page
my_kind = my_plugins:my_kind_page
[proftune.run_kinds]
my_kind = my_plugins:MY_KIND
'''

USE = '''
import json, sys
from typer.testing import CliRunner
from proftune import metrics
from proftune.cli import app
from proftune.compress import COMPILER_REGISTRY, COMPRESS_METHODS, QUANT_BACKEND_REGISTRY
from proftune.diagnose import CAUSES
from proftune.optimize import OPTIMIZE_STAGES
from proftune.search import PRUNERS, SAMPLERS, SEARCH_BACKENDS
from proftune.track import RUN_KINDS, Store

out = {"names": {
    "samplers": list(SAMPLERS), "pruners": list(PRUNERS), "backends": list(SEARCH_BACKENDS),
    "stages": list(OPTIMIZE_STAGES), "causes": list(CAUSES), "metrics": list(metrics.metric_names()),
    "methods": list(COMPRESS_METHODS), "quant": list(QUANT_BACKEND_REGISTRY), "compilers": list(COMPILER_REGISTRY),
    "run_kinds": list(RUN_KINDS)}}
runner = CliRunner()
out["help"] = {c: runner.invoke(app, [c, "--help"], env={"COLUMNS": "300"}).output for c in ("tune", "compress")}
out["help"]["runs"] = runner.invoke(app, ["runs", "list", "--help"], env={"COLUMNS": "300"}).output
db = "sqlite:///" + sys.argv[1] + "/p.db"
store = Store(db)
for kind in ("train", "my_kind"):
    rid = store.start_run(kind, "t")
    store.finish_run(rid)
    res = runner.invoke(app, ["report", str(rid), "--db", db, "--out", f"{sys.argv[1]}/{kind}.html", "--json"])
    out[kind] = {"exit": res.exit_code, "output": res.output,
                 "html": open(f"{sys.argv[1]}/{kind}.html").read() if res.exit_code == 0 else ""}
print(json.dumps(out))
'''

BAD = '''
from typing import Any, ClassVar
from torch import nn
from proftune.compress import BaseCompressMethod
from proftune.diagnose import BaseCheck
from proftune.optimize import BaseStage, StageOutputs


class BadOutputs(StageOutputs):
    STAGE: ClassVar[str] = "another-stage"


class BadStage(BaseStage):
    name = "bad-stage"
    share = 5.0
    record = BadOutputs
    after = "no-such-stage"

    def run(self, loop: Any, share: float, end: float) -> Any:
        raise NotImplementedError("never run: refused when registered")


class BadMethod(BaseCompressMethod):
    name = "a+b"
    save_format = "pickle"

    def apply(self, model: nn.Module, context: Any) -> nn.Module:
        return model


class BadCheck(BaseCheck):
    cause = ""

    def check(self, history: Any) -> Any:
        return None
'''

BAD_USE = '''
import json
from proftune.compress import COMPRESS_METHODS
from proftune.diagnose import CAUSES
from proftune.exceptions import ConfigError
from proftune.optimize import OPTIMIZE_STAGES, register_stage

out = {}
for label, read in (("method", lambda: list(COMPRESS_METHODS)), ("check", lambda: list(CAUSES)),
                    ("stage", lambda: list(OPTIMIZE_STAGES))):
    try:
        out[label] = read()
    except ConfigError as e:
        out[label] = "refused: " + str(e)
import bad_plugins  # the same stage through the decorator, once the entry points were read
try:
    register_stage(bad_plugins.BadStage)
    out["stage_decorated"] = "registered"
except ConfigError as e:
    out["stage_decorated"] = str(e)
out["stages_after"] = list(OPTIMIZE_STAGES)
print(json.dumps(out))
'''


def _install(site: Path, dist: str, module: str, source: str, entry_points: str) -> None:
    """What pip leaves of a package: the module and its ``.dist-info`` with the entry points."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def _run(site: Path, script: str, tmp: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, "-c", script, str(tmp)], capture_output=True, text=True, env=env,
                         cwd=tmp, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Warning" not in res.stderr, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("plugins")
    _install(tmp / "site", "my_plugins", "my_plugins", PLUGIN, ENTRY_POINTS)
    return _run(tmp / "site", USE, tmp)


def test_a_decorated_plugin_named_by_entry_points_registers_each_kind_once(installed: dict[str, Any]) -> None:
    names = installed["names"]
    expected = {"samplers": "my-random", "pruners": "my-never", "backends": "my-backend", "stages": "my-stage",
                "causes": "my_cause", "metrics": "my_energy_j", "methods": "my-method", "quant": "my-quant:dynamic",
                "compilers": "my-engine", "run_kinds": "my_kind"}
    for kind, name in expected.items():
        assert names[kind].count(name) == 1, (kind, names[kind])
    assert "tpe" in names["samplers"]
    assert "train" in names["run_kinds"]


def test_help_lists_the_installed_choices(installed: dict[str, Any]) -> None:
    tune, compress, runs = installed["help"]["tune"], installed["help"]["compress"], installed["help"]["runs"]
    for name in ("my-random", "my-never", "my-backend", "tpe"):
        assert name in tune
    for name in ("my-engine", "my-quant", "my-method"):
        assert name in compress
    assert "my_kind" in runs


def test_an_installed_page_replaces_a_built_in_one(installed: dict[str, Any]) -> None:
    assert installed["train"]["exit"] == 0, installed["train"]["output"]
    assert "MY TRAIN PAGE" in installed["train"]["html"]


def test_a_page_for_a_new_kind_of_run_needs_no_edit_of_src(installed: dict[str, Any]) -> None:
    assert installed["my_kind"]["exit"] == 0, installed["my_kind"]["output"]
    assert "MY KIND PAGE" in installed["my_kind"]["html"]


def test_entry_points_pass_the_checks_of_register(tmp_path: Path) -> None:
    _install(tmp_path / "site", "bad_plugins", "bad_plugins", BAD,
             "[proftune.compress_methods]\nbad = bad_plugins:BadMethod\n"
             "[proftune.checks]\nbad = bad_plugins:BadCheck\n")
    out = _run(tmp_path / "site", BAD_USE, tmp_path)
    method, check = out["method"], out["check"]
    assert str(method).startswith("refused"), method
    assert "'bad'" in method
    assert "proftune.compress_methods" in method
    assert "name must be a non-empty string without '+'" in method
    assert "save_format='pickle'" in method
    assert "cause must be a non-empty string" in str(check), check


def test_an_entry_point_stage_is_refused_as_the_decorator_refuses_it(tmp_path: Path) -> None:
    _install(tmp_path / "site", "bad_plugins", "bad_plugins", BAD,
             "[proftune.optimize_stages]\nbad-stage = bad_plugins:BadStage\n")
    out = _run(tmp_path / "site", BAD_USE, tmp_path)
    stage, decorated = str(out["stage"]), str(out["stage_decorated"])
    assert stage.startswith("refused"), stage
    assert "'bad-stage'" in stage
    assert "proftune.optimize_stages" in stage
    for problem in ("BadStage.share must be a share of the budget in [0, 1], but got 5.0",
                    "BadStage.after='no-such-stage' is no registered stage",
                    "BadStage.record must be a StageOutputs subclass whose STAGE is 'bad-stage'"):
        assert problem in decorated, decorated
    assert stage.endswith(decorated), (stage, decorated)  # the decorator's own message, after where it came from
    assert "bad-stage" not in out["stages_after"]
