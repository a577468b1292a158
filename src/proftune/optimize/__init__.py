"""The closed loop: baseline -> health -> compute -> layer value -> search -> final -> compress.

``proftune.optimize(task, budget="20m")`` is the entry point (bound in ``proftune/__init__.py``);
each stage calls the public API of the subpackage that owns its work and is recorded as a Run.
"""

from __future__ import annotations

from . import _api, _budget, _config, _layer_value, _output, _records, _search, _space, _state  # noqa: F401  (eager)
from ._api import OptimizeResult, optimize
from ._budget import SHARES, STAGES, Budget, Deadline
from ._changes import ParamChange
from ._config import GOALS, OptimizeConfig
from ._final import SearchGap, SeedSummary
from ._layer_value import (
    LayerFinding,
    LayerValue,
    layer_values,
    mean_ablation_hook,
)
from ._records import (
    STAGE_RECORDS,
    BaselineOutputs,
    CompressOutputs,
    ComputeOutputs,
    FinalOutputs,
    HealthOutputs,
    LayerValueOutputs,
    ModelFigures,
    SearchStageOutputs,
    StageOutputs,
    TrainedRun,
)
from ._result import (
    CompressedModel,
    FinalSummary,
    SplitComparisons,
    SplitSummaries,
    StageRow,
    VsBaseline,
)
from ._search import ConfigGroup, SearchOutcome, TrialLog, YellowFlag, find_flags
from ._space import SearchPlan, build_plan
from ._story import StageStory, Story, StoryLine

__all__ = [
    "GOALS",
    "SHARES",
    "STAGES",
    "STAGE_RECORDS",
    "BaselineOutputs",
    "Budget",
    "CompressOutputs",
    "CompressedModel",
    "ComputeOutputs",
    "ConfigGroup",
    "Deadline",
    "FinalOutputs",
    "FinalSummary",
    "HealthOutputs",
    "LayerFinding",
    "LayerValue",
    "LayerValueOutputs",
    "ModelFigures",
    "OptimizeConfig",
    "OptimizeResult",
    "ParamChange",
    "SearchGap",
    "SearchOutcome",
    "SearchPlan",
    "SearchStageOutputs",
    "SeedSummary",
    "SplitComparisons",
    "SplitSummaries",
    "StageOutputs",
    "StageRow",
    "StageStory",
    "Story",
    "StoryLine",
    "TrainedRun",
    "TrialLog",
    "VsBaseline",
    "YellowFlag",
    "build_plan",
    "find_flags",
    "layer_values",
    "mean_ablation_hook",
    "optimize",
]
