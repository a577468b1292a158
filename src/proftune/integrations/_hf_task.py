"""A Hugging Face model as a Task on seeded random token batches: for what needs no real data.

Profiling, batch size, recommend and compress' latency/size figures depend on shapes, not on
the text; ``loss`` is the model's own (``ModelOutput.loss``, from labels shaped for its head).
Metrics on random tokens mean nothing: train on real data with a Task or a LightningModule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from .._device import call_model, output_loss
from ..exceptions import ConfigError, TaskLoadError
from ..task import Task

__all__ = ["HFModelTask", "is_hf_model"]

_LM_HEADS = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForPreTraining")


def is_hf_model(obj: Any) -> bool:
    """Whether ``obj`` (class or instance) is a ``transformers.PreTrainedModel``; never imports it."""
    import inspect
    import sys

    hf = sys.modules.get("transformers")
    if hf is None:
        return False
    cls = obj if inspect.isclass(obj) else type(obj)
    return issubclass(cls, hf.PreTrainedModel)


class HFModelTask(Task):
    """``factory()`` (a PreTrainedModel class built from its default config, or a function that
    returns a model) on ``seq_len`` random tokens per sample, labels shaped for its head."""

    def __init__(self, factory: Callable[[], nn.Module], *, name: str, seq_len: int = 128,
                 samples: int = 512) -> None:
        self._factory = factory
        model = self._build()
        cfg: Any = model.config
        self.name = name  # type: ignore[misc]
        self.description = f"Hugging Face {type(model).__name__} on random tokens"  # type: ignore[misc]
        self.default_params = {"batch_size": 8}  # type: ignore[misc]
        self.default_epochs = 1  # type: ignore[misc]
        positions = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or seq_len
        self.seq_len = int(min(seq_len, positions))
        self.vocab = int(cfg.vocab_size)
        self.samples = samples
        kind = type(model).__name__
        if "ForSequenceClassification" in kind:
            self.labels = "class"
            self.num_labels = int(getattr(cfg, "num_labels", 2))
        elif any(h in kind for h in _LM_HEADS):
            self.labels = "tokens"
        else:
            self.labels = "none"

    def _build(self) -> nn.Module:
        try:
            model = self._factory()
        except Exception as exc:
            raise TaskLoadError(f"building the Hugging Face model failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(model, nn.Module) or not hasattr(model, "config"):
            raise TaskLoadError(f"the factory returned {type(model).__name__}, not a Hugging Face model.")
        return model

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return self._build()

    def _batches(self, batch_size: int, n: int, seed: int) -> list[dict[str, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        out = []
        for start in range(0, n, batch_size):
            b = min(batch_size, n - start)
            ids = torch.randint(0, self.vocab, (b, self.seq_len), generator=g)
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            if self.labels == "class":
                batch["labels"] = torch.randint(0, self.num_labels, (b,), generator=g)
            elif self.labels == "tokens":
                batch["labels"] = ids.clone()
            out.append(batch)
        return out

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        return self._batches(batch_size, max(self.samples, batch_size), seed=0)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        return self._batches(batch_size, max(self.samples // 4, batch_size), seed=1)

    def test_data(self, batch_size: int) -> Iterable[Any]:
        return self._batches(batch_size, max(self.samples // 4, batch_size), seed=2)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        out = call_model(model, batch)
        own = output_loss(out)
        if own is not None:
            return own
        from torch.utils._pytree import tree_flatten

        leaves = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not leaves:
            raise ConfigError(f"{type(model).__name__}'s output holds no loss and no floating tensor.")
        return sum(t.float().mean() for t in leaves)  # type: ignore[return-value]
