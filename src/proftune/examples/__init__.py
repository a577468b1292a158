"""Built-in tasks on real data that ships with scikit-learn or Python itself (and synthetic vision
and recommender tasks).

``proftune tasks`` lists them; any command takes their name in place of a task file.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..task import register_builtin_tasks
from ._data import TensorBatches, resplit_tensors

__all__ = ["BUILTIN_TASKS", "BuiltinTask", "TensorBatches", "resplit_tensors"]


@dataclass(frozen=True)
class BuiltinTask:
    """Where a built-in task lives and what it is."""

    target: str
    description: str
    requires: str = ""


BUILTIN_TASKS: dict[str, BuiltinTask] = {
    "digits-mlp": BuiltinTask(
        "proftune.examples._digits:DigitsMLP",
        "sklearn digits (1797 8x8 images, 10 classes), 2-hidden-layer MLP",
    ),
    "digits-cnn": BuiltinTask(
        "proftune.examples._digits:DigitsCNN",
        "sklearn digits as 1x8x8 images, 3-conv CNN with batch norm",
    ),
    "digits-transformer": BuiltinTask(
        "proftune.examples._digits:DigitsTransformer",
        "sklearn digits, each image a sequence of 8 rows into a Transformer encoder (SDPA)",
    ),
    "wine-mlp": BuiltinTask(
        "proftune.examples._wine:WineMLP",
        "sklearn wine (178 samples, 13 features, 3 classes), MLP",
    ),
    "implicit-two-tower": BuiltinTask(
        "proftune.examples._recsys:ImplicitTwoTower",
        "generated implicit feedback (Zipf items, latent rank 8), two-tower recommender at dim 64",
    ),
    "char-gpt": BuiltinTask(
        "proftune.examples._chargpt:CharGPTTask",
        "character-level GPT, nanoGPT's CPU shape (4x4x128, block 64, batch 12, 2000 steps, warm-up + cosine) "
        "on ~3 MB of the Python standard library's own sources; minutes per training",
    ),
    "resnet18-synthetic": BuiltinTask(
        "proftune.examples._vision:ResNet18Synthetic",
        "torchvision ResNet-18, random init, random 3x224x224 inputs (profiling, pruning)",
        requires="torchvision",
    ),
}

# each name is a task spec of load_task's; proftune's __init__ imports this package
register_builtin_tasks({name: entry.target for name, entry in BUILTIN_TASKS.items()})
