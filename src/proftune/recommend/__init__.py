"""Training parameters computed from measurements: batch size, lr, scaling, critical batch,
accumulation, precision, data loading, bottleneck layers.

``recommend`` reads one Profile and adds what a Profile cannot hold (memory at other batch
sizes, the LR range test, the gradient noise scale); each part is also a function of its own.
"""

from __future__ import annotations

from .._callable import make_callable as _make_callable
from .._deprecated import renamed as _renamed
from .._units import format_bytes, parse_memory
from ._accumulation import AccumulationPlan, StepCost, plan_accumulation
from ._api import RecommendConfig, recommend
from ._batch_size import BatchSizeResult, MemoryProbe, search_max_batch
from ._ddp import DDPPlan, plan_ddp_batch
from ._embedding import FactorizedEmbedding, HashedRows, hashed_remap, recommend_embedding_dim
from ._evidence import BatchSizeEvidence, OptimizerEvidence
from ._lr_find import LRFindResult, LRRangeCallback, smooth_curve, suggest_lr
from ._measurements import BatchSizeConfig, LRFindConfig, find_batch_size, lr_find, static_memory
from ._noise_scale import NoiseScaleCallback, NoiseScaleResult, noise_scale
from ._optimizer import CompareConfig, OptimizerComparison, OptimizerTrial, compare_optimizers
from ._records import (
    CONDITIONAL_NAMES,
    RECOMMENDATION_NAMES,
    MeasuredEffect,
    Recommendation,
    Recommendations,
    keep_unless_better,
)
from ._rules import bottleneck_rule, data_loading_rule, precision_rule
from ._scaling import ScalingRule, optimizer_family, scale_lr

__all__ = [
    "CONDITIONAL_NAMES",
    "RECOMMENDATION_NAMES",
    "AccumulationPlan",
    "BatchSizeConfig",
    "BatchSizeEvidence",
    "BatchSizeResult",
    "CompareConfig",
    "DDPPlan",
    "FactorizedEmbedding",
    "HashedRows",
    "LRFindConfig",
    "LRFindResult",
    "LRRangeCallback",
    "MeasuredEffect",
    "MemoryProbe",
    "NoiseScaleCallback",
    "NoiseScaleResult",
    "OptimizerComparison",
    "OptimizerEvidence",
    "OptimizerTrial",
    "RecommendConfig",
    "Recommendation",
    "Recommendations",
    "ScalingRule",
    "StepCost",
    "bottleneck_rule",
    "compare_optimizers",
    "data_loading_rule",
    "find_batch_size",
    "format_bytes",
    "hashed_remap",
    "keep_unless_better",
    "lr_find",
    "noise_scale",
    "optimizer_family",
    "parse_memory",
    "plan_accumulation",
    "plan_ddp_batch",
    "precision_rule",
    "recommend",
    "recommend_embedding_dim",
    "scale_lr",
    "search_max_batch",
    "smooth_curve",
    "static_memory",
    "suggest_lr",
]

#: Moved to :mod:`proftune.predict` (the models of cost), served here with a DeprecationWarning.
_MOVED = ("DEVICES", "PREDICT_SCHEMA_VERSION", "DeviceSpec", "LayerPrediction", "MemoryModel", "PeakAt",
          "PredictConfig", "PredictResult", "PredictedMemory", "PredictedStep", "StepTracer",
          "fit_memory_model", "predict", "resolve_target")
__getattr__ = _renamed(__name__, {n: n for n in _MOVED}, home="proftune.predict")

# ``proftune.recommend(...)`` calls :func:`recommend`: the subpackage is the one object of the name.
_make_callable(__name__)
