"""Hugging Face models built from their configs (random init, no download) as proftune tasks.

Used by the predict tests and by ``benchmarks/predict.py`` (which names them by file path,
``tests/predict/hf_tasks.py:TinyBert``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import nn

import proftune


class _TokenTask(proftune.Task):
    """Random token ids, ``samples`` of them per epoch, seeded; the model's own loss."""

    seq_len: ClassVar[int] = 32
    vocab: ClassVar[int] = 1000
    samples: ClassVar[int] = 4096
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-4, "batch_size": 8}

    def _batches(self, batch_size: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(max(1, self.samples // batch_size)):
            ids = torch.randint(0, self.vocab, (batch_size, self.seq_len), generator=gen)
            yield ids, self._labels(ids, gen)

    def _labels(self, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return ids

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterator[Any]:
        return self._batches(batch_size, 0)

    def val_data(self, batch_size: int) -> Iterator[Any]:
        return self._batches(batch_size, 1)


class TinyBert(_TokenTask):
    """BERT for sequence classification, 2 layers of width 64, from ``transformers.BertConfig``."""

    name = "tiny-bert"

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        from transformers import BertConfig, BertForSequenceClassification

        cfg = BertConfig(vocab_size=self.vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=256, max_position_embeddings=64, num_labels=2,
                         attn_implementation="sdpa")
        return BertForSequenceClassification(cfg)

    def _labels(self, ids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, 2, (ids.shape[0],), generator=gen)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        ids, labels = batch
        out: torch.Tensor = model(input_ids=ids, labels=labels).loss
        return out


class _Llama(_TokenTask):
    """A Llama-style decoder (``transformers.LlamaConfig``), causal LM loss on its own tokens."""

    config: ClassVar[dict[str, int]] = {}

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=self.vocab, max_position_embeddings=max(self.seq_len, 64),
                          attn_implementation="sdpa", **self.config)
        return LlamaForCausalLM(cfg)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        ids, labels = batch
        # no KV cache in training (it would also change between a checkpointed forward and its recompute)
        out: torch.Tensor = model(input_ids=ids, labels=labels, use_cache=False).loss
        return out


class TinyLlama(_Llama):
    name = "tiny-llama"
    config: ClassVar[dict[str, int]] = {"hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
                                        "num_attention_heads": 4, "num_key_value_heads": 4}


class Llama7B(_Llama):
    """Llama-2-7B's shapes: 32 layers of width 4096, MLP 11008, 32 heads, vocab 32000 (6.74B
    parameters). Predict only: built on the meta device, never materialised."""

    name = "llama-7b"
    seq_len: ClassVar[int] = 2048
    vocab: ClassVar[int] = 32000
    samples: ClassVar[int] = 64
    config: ClassVar[dict[str, int]] = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                                        "num_attention_heads": 32, "num_key_value_heads": 32}


class Gpt2Small(_TokenTask):
    """GPT-2 small's shapes (``transformers.GPT2Config``'s defaults: 12 layers of width 768, vocab
    50257, context 1024; 124M parameters, the head tied to the embedding), causal LM loss."""

    name = "gpt2-small"
    seq_len: ClassVar[int] = 1024
    vocab: ClassVar[int] = 50257
    samples: ClassVar[int] = 64

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(vocab_size=self.vocab, n_positions=self.seq_len,
                                          attn_implementation="sdpa"))

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        ids, labels = batch
        out: torch.Tensor = model(input_ids=ids, labels=labels, use_cache=False).loss
        return out
