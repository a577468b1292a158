"""Models of cost: a training step's memory and time predicted without running it.

``predict`` traces the fit loop's own step (:func:`proftune.train.run_step`: accumulation,
autocast, GradScaler, clipping, the optimizer) on fake tensors and prices it on a target device
(the device table and the roofline); the linear memory model ``peak(B) = a + b·B`` gives the
largest batch that fits, the same model ``find_batch_size`` fits to measured steps.
"""

from __future__ import annotations

from .._callable import make_callable as _make_callable
from ._api import PredictConfig, predict
from ._checkpointing import CHECKPOINTING, apply_activation_checkpointing, block_units
from ._devices import DEVICES, DeviceSpec, resolve_target, roofline_ms
from ._link import COLLECTIVES, LinkFigures, measure_link, sweep_collectives
from ._memory_model import MIN_MARGIN_FRACTION, RESIDUAL_MARGIN, MemoryModel, fit_memory_model
from ._records import (
    ESTIMATE_NOTE,
    PREDICT_SCHEMA_VERSION,
    LayerPrediction,
    ParallelPlan,
    ParallelPrediction,
    PeakAt,
    PredictedMemory,
    PredictedStep,
    PredictResult,
)
from ._sharding import OFFLOAD, STRATEGIES, BaseStrategy, Collective, DeepSpeedStates, ModelSizes
from ._trace import PHASES, StepTracer

__all__ = [
    "CHECKPOINTING",
    "COLLECTIVES",
    "DEVICES",
    "ESTIMATE_NOTE",
    "MIN_MARGIN_FRACTION",
    "OFFLOAD",
    "PHASES",
    "PREDICT_SCHEMA_VERSION",
    "RESIDUAL_MARGIN",
    "STRATEGIES",
    "BaseStrategy",
    "Collective",
    "DeepSpeedStates",
    "DeviceSpec",
    "LayerPrediction",
    "LinkFigures",
    "MemoryModel",
    "ModelSizes",
    "ParallelPlan",
    "ParallelPrediction",
    "PeakAt",
    "PredictConfig",
    "PredictResult",
    "PredictedMemory",
    "PredictedStep",
    "StepTracer",
    "apply_activation_checkpointing",
    "block_units",
    "fit_memory_model",
    "measure_link",
    "predict",
    "resolve_target",
    "roofline_ms",
    "sweep_collectives",
]

# ``proftune.predict(task, ...)`` calls :func:`predict`: the subpackage is the one object of the name.
_make_callable(__name__)
