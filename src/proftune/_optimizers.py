"""The optimizers a task's params name (``params["optimizer"]``), built with their lr and decay.

Below both the Task (whose default ``configure_optimizer`` builds one) and the fit loop (which
validates the name), so neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .exceptions import ConfigError

OPTIMIZERS = ("adamw", "adam", "sgd", "lbfgs")


def build_optimizer(parameters: Iterable[torch.nn.Parameter], params: dict[str, Any]) -> torch.optim.Optimizer:
    """The optimizer named by ``params['optimizer']`` with its lr, weight_decay and momentum."""
    name = str(params.get("optimizer", "adamw")).lower()
    lr = float(params.get("lr", 1e-3))
    wd = float(params.get("weight_decay", 0.0 if name in ("sgd", "lbfgs") else 1e-2))
    plist = [p for p in parameters if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(plist, lr=lr, weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(plist, lr=lr, weight_decay=wd)
    if name == "sgd":
        return torch.optim.SGD(plist, lr=lr, momentum=float(params.get("momentum", 0.0)), weight_decay=wd)
    if name == "lbfgs":
        # strong Wolfe line search: without it a mini-batch LBFGS step easily diverges
        return torch.optim.LBFGS(plist, lr=lr, line_search_fn="strong_wolfe")
    raise ConfigError(f"param optimizer={name!r} is unknown; valid: {', '.join(OPTIMIZERS)}.")
