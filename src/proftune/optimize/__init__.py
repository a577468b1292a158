"""The closed loop: baseline -> health -> compute -> layer value -> search -> final -> compress.

``proftune.optimize(task, budget="20m")`` is the entry point;
each stage calls the public API of the subpackage that owns its work and is recorded as a Run.
"""

from __future__ import annotations

from .._callable import make_callable as _make_callable
from .._deprecated import renamed
from . import _builtin  # noqa: F401  (registers the built-in stages)
from ._api import OptimizeResult, optimize
from ._budget import Budget, Deadline
from ._changes import ParamChange
from ._config import OPTIMIZE_GOALS, OptimizeConfig
from ._context import StageClock, StageContext
from ._decide import Comparison, compare_race
from ._final_records import SearchGap, SeedSummary
from ._layer_value import (
    LayerFinding,
    LayerValue,
    layer_values,
    mean_ablation_hook,
)
from ._planner import Planner
from ._records import (
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
from ._result_records import (
    CompressedModel,
    FinalSummary,
    SplitComparisons,
    SplitSummaries,
    StageRow,
    StageStory,
    Story,
    StoryLine,
    VsBaseline,
)
from ._search import SearchOutcome, find_flags
from ._search_plan import SearchPlan, build_plan
from ._search_records import ConfigGroup, TrialLog, YellowFlag
from ._stages import (
    OPTIMIZE_STAGES,
    SHARES,
    STAGE_RECORDS,
    STAGE_REGISTRY,
    BaseStage,
    StageResult,
    register_stage,
)
from ._state import StageStatus

__all__ = [
    "OPTIMIZE_GOALS",
    "OPTIMIZE_STAGES",
    "SHARES",
    "STAGE_RECORDS",
    "STAGE_REGISTRY",
    "BaseStage",
    "BaselineOutputs",
    "Budget",
    "Comparison",
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
    "Planner",
    "SearchGap",
    "SearchOutcome",
    "SearchPlan",
    "SearchStageOutputs",
    "SeedSummary",
    "SplitComparisons",
    "SplitSummaries",
    "StageClock",
    "StageContext",
    "StageOutputs",
    "StageResult",
    "StageRow",
    "StageStatus",
    "StageStory",
    "Story",
    "StoryLine",
    "TrainedRun",
    "TrialLog",
    "VsBaseline",
    "YellowFlag",
    "build_plan",
    "compare_race",
    "find_flags",
    "layer_values",
    "mean_ablation_hook",
    "optimize",
    "register_stage",
]

#: ``STAGES`` and ``GOALS``: former names of OPTIMIZE_STAGES and OPTIMIZE_GOALS, deprecated.
__getattr__ = renamed(__name__, {"STAGES": "OPTIMIZE_STAGES", "GOALS": "OPTIMIZE_GOALS"})

# ``proftune.optimize(...)`` calls :func:`optimize`: the subpackage is the one object of the name.
_make_callable(__name__)
