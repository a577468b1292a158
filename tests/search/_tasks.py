"""Tasks for the search tests: wine-mlp (fast) with faults that a param switches on."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
from torch import nn

from proftune.examples._wine import WineMLP


class FaultyWine(WineMLP):
    """``fault``: 'raise' (user exception), 'oom' (device out of memory), 'nan' (loss NaN)."""

    name = "faulty-wine"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        if params.get("fault") == "raise":
            raise ValueError(f"user code broke on hidden={params.get('hidden')}")
        return super().build_model(params)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        fault = getattr(model, "_fault", None)
        loss = super().loss(model, batch)
        if fault == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        if fault == "nan":
            return loss * float("nan")
        return loss

    def configure_optimizer(self, model: nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        model._fault = params.get("fault")  # type: ignore[assignment]
        return super().configure_optimizer(model, params)


class BlockingWine(WineMLP):
    """Blocks (sleeps) in its 3rd model build when $PROFTUNE_TEST_BLOCK is set, after saying so."""

    name = "blocking-wine"
    builds = 0

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        type(self).builds += 1
        if os.environ.get("PROFTUNE_TEST_BLOCK") and type(self).builds == 3:
            sys.stderr.write("BLOCKING-IN-TRIAL\n")
            sys.stderr.flush()
            time.sleep(600)
        return super().build_model(params)
