"""One check per cause of bad training, each behind :class:`BaseCheck`; ``CHECKS`` runs them.

The built-ins register here exactly as a plug-in does (:func:`register_check`); the order they
register in settles ties when two findings explain each other equally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from ..._registry import LiveSequence
from .._causes import CHECK_REGISTRY
from ._base import BaseCheck, register_check
from ._batchnorm import BatchNormSmallBatch
from ._dead_units import DeadUnits
from ._exploding import ExplodingGradients
from ._lr_too_high import LrTooHigh
from ._lr_too_low import LrTooLow
from ._nan_inf import NanInf
from ._oscillating import OscillatingLoss
from ._overfitting import Overfitting
from ._saturated import SaturatedActivations
from ._schedule import NoLrDecay, NoWarmup
from ._slow import SlowConvergence
from ._unshuffled import Unshuffled
from ._vanishing import VanishingGradients

__all__ = ["CHECKS", "BaseCheck", "register_check"]

for _check in (LrTooHigh, Unshuffled, ExplodingGradients, VanishingGradients, SaturatedActivations,
               DeadUnits, NanInf, BatchNormSmallBatch, NoWarmup, OscillatingLoss, Overfitting,
               LrTooLow, SlowConvergence, NoLrDecay):
    register_check(_check)

#: Every registered check, in the order they run (a live view: a plug-in registered later is in it).
CHECKS: Sequence[BaseCheck] = LiveSequence(lambda: cast(tuple[BaseCheck, ...], tuple(CHECK_REGISTRY.values())))
