"""The optimizers a task's params name (``params["optimizer"]``), built with their lr and decay.

Below both the Task (whose default ``configure_optimizer`` builds one) and the fit loop (which
validates the name), so neither imports the other for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .exceptions import ConfigError

OPTIMIZERS = ("adamw", "adam", "sgd", "lbfgs")

# The one home of the fit loop's optimizer defaults: what a task's params mean when they leave
# these out (the Task's configure_optimizer, recommend, predict and optimize read them here).
DEFAULT_OPTIMIZER = "adamw"
DEFAULT_LR = 1e-3
DEFAULT_MOMENTUM = 0.0
#: The decay AdamW and Adam get when it is unset (torch's AdamW default).
DEFAULT_WEIGHT_DECAY = 1e-2
#: The optimizers that get no weight decay when it is unset.
NO_DECAY_BY_DEFAULT = ("sgd", "lbfgs")


def default_weight_decay(optimizer: str) -> float:
    """The weight decay ``optimizer`` gets when the params leave it out."""
    return 0.0 if str(optimizer).lower() in NO_DECAY_BY_DEFAULT else DEFAULT_WEIGHT_DECAY


def build_optimizer(parameters: Iterable[torch.nn.Parameter], params: Mapping[str, Any]) -> torch.optim.Optimizer:
    """The optimizer named by ``params['optimizer']`` with its lr, weight_decay and momentum."""
    name = str(params.get("optimizer", DEFAULT_OPTIMIZER)).lower()
    lr = float(params.get("lr", DEFAULT_LR))
    wd = float(params.get("weight_decay", default_weight_decay(name)))
    plist = [p for p in parameters if p.requires_grad]
    if name == "adamw":
        return torch.optim.AdamW(plist, lr=lr, weight_decay=wd)
    if name == "adam":
        return torch.optim.Adam(plist, lr=lr, weight_decay=wd)
    if name == "sgd":
        return torch.optim.SGD(plist, lr=lr, momentum=float(params.get("momentum", DEFAULT_MOMENTUM)), weight_decay=wd)
    if name == "lbfgs":
        # strong Wolfe line search: without it a mini-batch LBFGS step easily diverges
        return torch.optim.LBFGS(plist, lr=lr, line_search_fn="strong_wolfe")
    raise ConfigError(f"param optimizer={name!r} is unknown; valid: {', '.join(OPTIMIZERS)}.")
