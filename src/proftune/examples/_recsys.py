"""A built-in recommender: implicit feedback the code generates, and a two-tower model at dim 64.

The data has a known answer. Users and items have latent factors of rank ``spec.rank`` (8); a
user picks items with probability ∝ popularity(item) · exp(affinity), popularity Zipf-distributed
over the items (exponent ``spec.zipf``, 1.2), so that a few items take most interactions and a
long tail is seen rarely or never. One interaction per user is held out for validation (leave one out).

The model is the standard two-tower retrieval model: a user table and an item table (+ an item
bias), trained with an in-batch softmax (the other items of the batch are the negatives) with
the logQ correction for their sampling frequency (Yi et al. 2019, "Sampling-bias-corrected
neural modeling for large corpus item recommendations"). The metric is the hit rate at 10: the
held-out item among the 10 best-scored items the user has not interacted with.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar, cast

import torch
from torch import nn

from ..task import Task
from ._data import TensorBatches

TOP_K = 10


@dataclass(frozen=True)
class FeedbackSpec:
    """The generated data: users, items, interactions per user, the latent rank of the
    affinities, the Zipf exponent of the items' popularity, the affinities' scale, the seed."""

    users: int = 2000
    items: int = 2000
    per_user: int = 30
    rank: int = 8
    zipf: float = 1.2
    affinity: float = 3.0
    seed: int = 0


@lru_cache(maxsize=4)
def implicit_feedback(spec: FeedbackSpec) -> dict[str, torch.Tensor]:
    """The interactions (train pairs, one held-out item per user), the training mask, log q."""
    gen = torch.Generator().manual_seed(spec.seed)
    p = torch.randn(spec.users, spec.rank, generator=gen) / spec.rank ** 0.5
    q = torch.randn(spec.items, spec.rank, generator=gen)
    ranks = torch.randperm(spec.items, generator=gen).double() + 1.0
    log_pop = (-spec.zipf * ranks.log()).float()
    logits = log_pop + spec.affinity * (p @ q.T)
    picks = torch.multinomial(logits.softmax(dim=1), spec.per_user, replacement=False, generator=gen)
    users = torch.arange(spec.users).repeat_interleave(spec.per_user - 1)
    items = picks[:, 1:].reshape(-1)
    seen = torch.zeros(spec.users, spec.items, dtype=torch.bool)
    seen[users, items] = True
    freq = torch.bincount(items, minlength=spec.items).float()
    return {"users": users, "items": items, "val_users": torch.arange(spec.users), "val_items": picks[:, 0],
            "seen": seen, "log_q": (freq.clamp(min=1.0) / freq.sum()).log()}


class TwoTower(nn.Module):
    """A user table and an item table of ``dim`` columns; ``forward(users, items)`` is the
    in-batch score matrix (B x B) with the logQ correction, :meth:`score_all` the users' scores
    of every item."""

    def __init__(self, users: int, items: int, dim: int, log_q: torch.Tensor) -> None:
        super().__init__()
        self.user_emb = nn.Embedding(users, dim)
        self.item_emb = nn.Embedding(items, dim)
        self.item_bias = nn.Embedding(items, 1)
        # the initial score u·v has variance dim·std⁴: std ∝ dim^(-1/4) keeps it the same at every
        # width, so that a narrower table does not start flatter and learn more slowly
        for table in (self.user_emb, self.item_emb):
            nn.init.normal_(table.weight, std=0.05 * (64 / dim) ** 0.25)
        nn.init.zeros_(self.item_bias.weight)
        self.log_q: torch.Tensor
        self.register_buffer("log_q", log_q.clone(), persistent=False)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        u = self.user_emb(users)
        v = self.item_emb(items)
        bias = self.item_bias(items).squeeze(-1)
        return cast(torch.Tensor, u @ v.T + (bias - self.log_q[items]).unsqueeze(0))

    def score_all(self, users: torch.Tensor) -> torch.Tensor:
        # ``.weight``: the whole table, whatever module holds it (a resized one exposes it too)
        items = cast(torch.Tensor, self.item_emb.weight)
        bias = cast(torch.Tensor, self.item_bias.weight)
        return cast(torch.Tensor, self.user_emb(users) @ items.T + bias.T)


class ImplicitTwoTower(Task):
    name = "implicit-two-tower"
    description = ("generated implicit feedback (2000 users, 2000 Zipf-1.2 items, latent rank 8), "
                   "two-tower retrieval model, in-batch softmax (params: dim=64)")
    default_params: ClassVar[dict[str, Any]] = {"lr": 1e-2, "batch_size": 512, "optimizer": "adamw",
                                                "weight_decay": 0.0, "dim": 64}
    default_epochs: ClassVar[int] = 8
    metric_directions: ClassVar[dict[str, str]] = {"hit_rate@10": "max"}
    #: Which param sets the columns of which table (``recommend`` retrains through it).
    embedding_params: ClassVar[dict[str, str]] = {"user_emb": "dim", "item_emb": "dim"}
    #: The generated data; its ``rank`` is the answer the embedding row should find.
    spec: ClassVar[FeedbackSpec] = FeedbackSpec()

    def _data(self) -> dict[str, torch.Tensor]:
        return implicit_feedback(self.spec)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return TwoTower(self.spec.users, self.spec.items, int(params.get("dim", 64)), self._data()["log_q"])

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        d = self._data()
        return TensorBatches(d["users"], d["items"], batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        d = self._data()
        return TensorBatches(d["val_users"], d["val_items"], batch_size, shuffle=False)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        users, items = batch
        logits = model(users, items)
        # the same item twice in a batch is not a negative of itself
        same = items.unsqueeze(0) == items.unsqueeze(1)
        logits = logits.masked_fill(same & ~torch.eye(len(items), dtype=torch.bool, device=items.device),
                                    float("-inf"))
        return nn.functional.cross_entropy(logits, torch.arange(len(items), device=items.device))

    def evaluate(self, model: nn.Module, data: Iterable[Any]) -> dict[str, float]:
        seen = self._data()["seen"]
        hits = total = 0
        loss = 0.0
        for users, items in data:
            scores = cast(Any, model).score_all(users).masked_fill(seen[users.cpu()].to(users.device), float("-inf"))
            loss += float(nn.functional.cross_entropy(scores, items, reduction="sum"))
            top = scores.topk(TOP_K, dim=1).indices
            hits += int((top == items.unsqueeze(1)).any(dim=1).sum())
            total += int(users.shape[0])
        return {"val_loss": loss / max(total, 1), "hit_rate@10": hits / max(total, 1)}
