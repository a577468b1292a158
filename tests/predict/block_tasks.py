"""A deep stack of small residual blocks: where sharding per block shows.

With eight or more blocks, one GPU's shard plus the one or two blocks in flight is far from the
whole model, so a prediction that keeps the model's full gradients (or all its gathered
parameters) at the peak is visibly wrong against a measured FSDP2 run. Plain torch (no
``transformers``), so the spawned ranks of ``sharded_runs.py`` start quickly.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import nn

import proftune


class _Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class _Stack(nn.Module):
    def __init__(self, vocab: int, width: int, blocks: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_Block(width) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        # (tokens, vocab) from a 2-D matmul: a fresh tensor, not a view (FSDP2 warns on a view output)
        out: torch.Tensor = self.head(self.norm(x).reshape(-1, x.shape[-1]))
        return out


class DeepBlocks(proftune.Task):
    """``blocks`` residual MLP blocks of ``width`` over token ids (sequence ``seq_len``), the
    tokens' own ids as labels; seeded random data. Params: ``width``, ``blocks``."""

    name = "deep-blocks"
    vocab: ClassVar[int] = 64
    seq_len: ClassVar[int] = 8
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-3, "batch_size": 2, "width": 128, "blocks": 8}

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _Stack(self.vocab, int(params.get("width", 128)), int(params.get("blocks", 8)))

    def _batches(self, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(4):
            yield torch.randint(0, self.vocab, (batch_size, self.seq_len), generator=gen)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterator[Any]:
        return self._batches(batch_size, 0)

    def val_data(self, batch_size: int) -> Iterator[Any]:
        return self._batches(batch_size, 1)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(batch), batch.reshape(-1))
