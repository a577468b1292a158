"""The ``embedding_dim`` row: width from the trained spectrum, a long tail hashed, the effect retrained."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import proftune
from proftune.examples._recsys import FeedbackSpec, ImplicitTwoTower
from proftune.exceptions import ConfigError
from proftune.profile import IndexStats, TableSpectrum, index_stats, table_spectrum
from proftune.recommend import RECOMMENDATION_NAMES
from proftune.recommend._embedding import (
    EmbeddingConfig,
    FactorizedEmbedding,
    HashedRows,
    TablePlan,
    _resized,
    hashed_remap,
    plan_table,
    recommend_embedding_dim,
)
from proftune.train import TrainParams


class SmallTwoTower(ImplicitTwoTower):
    """The built-in recommender at a smaller size: latent rank 4, dim 32."""

    spec: ClassVar[FeedbackSpec] = FeedbackSpec(users=400, items=500, per_user=16, rank=4)
    default_params: ClassVar[dict[str, Any]] = {**ImplicitTwoTower.default_params, "batch_size": 128, "dim": 32}
    default_epochs: ClassVar[int] = 4


class _MF(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.users = nn.Embedding(300, dim)
        self.items = nn.Embedding(200, dim)
        for t in (self.users, self.items):
            nn.init.normal_(t.weight, std=0.3)

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return (self.users(users) * self.items(items)).sum(-1)


class RatingsMF(proftune.Task):
    """Explicit ratings of rank 3 plus noise, a third of them observed; matrix factorisation at
    dim 16 (MSE): small enough to train twice in a second or two."""

    rank: ClassVar[int] = 3
    default_params: ClassVar[dict[str, Any]] = {"lr": 3e-2, "batch_size": 256, "optimizer": "adamw",
                                                "weight_decay": 0.0, "dim": 16}
    default_epochs: ClassVar[int] = 6
    embedding_params: ClassVar[dict[str, str]] = {"users": "dim", "items": "dim"}

    def _data(self) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(0)
        ratings = torch.randn(300, self.rank, generator=gen) @ torch.randn(self.rank, 200, generator=gen)
        observed = (torch.rand(300, 200, generator=gen) < 0.35).nonzero()
        observed = observed[torch.randperm(len(observed), generator=gen)]
        u, i = observed[:, 0], observed[:, 1]
        y = ratings[u, i] + 0.3 * torch.randn(len(u), generator=gen)
        cut = int(0.85 * len(u))
        return u[:cut], i[:cut], y[:cut], u[cut:], i[cut:], y[cut:]

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _MF(int(params.get("dim", 16)))

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Any:
        from proftune.examples import TensorBatches

        u, i, y, *_ = self._data()
        return TensorBatches(torch.stack([u, i], 1), y, batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Any:
        from proftune.examples import TensorBatches

        *_, u, i, y = self._data()
        return TensorBatches(torch.stack([u, i], 1), y, batch_size, shuffle=False)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x[:, 0], x[:, 1]), y)


def test_recommend_sizes_the_tables_at_the_true_rank_and_measures_the_retrained_model() -> None:
    task = RatingsMF()
    recs = proftune.recommend(task, device="cpu", lr_steps=20, noise_steps=3, optimizer_budget_s=0)
    assert [r.name for r in recs] == [*RECOMMENDATION_NAMES, "embedding_dim"]
    row = recs.get("embedding_dim")
    assert row.value == {"users": task.rank, "items": task.rank}, row.reason
    ev = row.evidence
    users = ev["tables"]["users"]
    assert users["never_touched"] == 0
    assert users["signal_dims"]["95%"] == task.rank
    assert users["energy_dims"]["99%"] > task.rank  # noise fitted in the spare columns
    assert ev["params_to_set"] == {"dim": task.rank}
    assert ev["params_saved"] == (300 + 200) * (16 - task.rank)
    assert ev["memory_saved_bytes"] > ev["params_saved"] * 4  # weights, grads and AdamW's two moments
    assert ev["metric"] == "val_loss"
    # at the true rank the model fits no noise: its validation error is no worse than at dim 16
    assert ev["resized_metric"] <= ev["original_metric"] * 1.05, row.effect


def test_a_training_that_diverges_keeps_the_tables_and_says_why() -> None:
    """A rate far too high leaves NaN in a table: its singular values cannot be computed (they
    stopped the optimize loop's compute stage on a generated task at lr 1.97), so the row keeps the
    current dims and says the training diverged; the spectrum itself refuses non-finite weights."""
    task = RatingsMF()
    params = {**task.default_params, "lr": 1e12}
    row = recommend_embedding_dim(task, params, device=torch.device("cpu"), config=EmbeddingConfig(budget_s=5))
    assert row is not None
    assert row.value == {"users": 16, "items": 16}
    assert "diverged" in row.reason
    assert row.evidence["kept_current"] == "inconclusive"
    assert row.evidence["non_finite"]
    with pytest.raises(ConfigError, match="non-finite"):
        table_spectrum("users", torch.full((4, 3), math.nan))


def test_a_task_without_embeddings_gets_no_row() -> None:
    from proftune.recommend._embedding import recommend_embedding_dim

    task = proftune.load_task("digits-mlp")
    assert recommend_embedding_dim(task, dict(task.default_params), device=torch.device("cpu")) is None


def _stats(counts: torch.Tensor, dim: int = 32) -> IndexStats:
    return index_stats("t", counts, dim)


def _spectrum(dims95: int, dim: int = 32) -> TableSpectrum:
    return TableSpectrum(table="t", rows_used=100, dim=dim, singular_values=(), energy_dims={"95%": dim},
                         stable_rank=2.0, signal_rank=dims95 + 2, noise_threshold=1.0,
                         signal_dims={"90%": dims95 - 1, "95%": dims95, "99%": dims95 + 1})


def test_a_long_tail_gets_a_frequency_threshold_and_hashed_buckets() -> None:
    counts = torch.zeros(1000, dtype=torch.long)
    counts[:600] = 50  # 600 rows take almost every lookup; 400 rows read once or never
    counts[600:700] = 1
    plan = plan_table(_stats(counts), _spectrum(6), counts)
    assert plan.new_dim == 6
    assert plan.min_count == 50  # the least-read row among those that take 99% of the lookups
    assert plan.rows_kept == 600
    assert plan.buckets == 50  # 400 rare rows, 8 a bucket
    assert plan.new_rows == 650
    remap = hashed_remap(counts, plan.min_count, plan.buckets)
    assert remap[:600].tolist() == list(range(600))
    assert int(remap[600:].min()) >= 600
    assert int(remap[600:].max()) < 650
    # no tail: nothing hashed; a wide signal rounds up to a multiple of 8
    flat = torch.full((1000,), 20, dtype=torch.long)
    wide = plan_table(_stats(flat), _spectrum(19), flat)
    assert wide.rows_kept is None
    assert wide.new_dim == 24


class _Tagger(proftune.Task):
    """Tokens -> an embedding -> a linear head: a model with no ``embedding_params``."""

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return nn.Sequential(nn.Embedding(100, 16), nn.Flatten(), nn.Linear(16 * 3, 2))


def test_without_a_width_param_the_table_is_factorised_and_the_model_keeps_its_shapes() -> None:
    task = _Tagger()
    counts = torch.ones(100, dtype=torch.long)
    plan = TablePlan("0", dim=16, new_dim=4, rows=100)
    model, params, how = _resized(task, TrainParams(), [plan], {"0": counts})
    assert isinstance(model[0], FactorizedEmbedding)
    assert model[0].embedding.weight.shape == (100, 4)
    assert model(torch.randint(0, 100, (5, 3))).shape == (5, 2)
    assert model[0].weight.shape == (100, 16)
    assert sum(p.numel() for p in model[0].parameters()) == 100 * 4 + 4 * 16
    assert params.params == {}
    assert "factorised 100x4 + 4x16" in how


def test_hashed_rows_keep_the_task_init_of_kept_rows_and_share_buckets() -> None:
    task = SmallTwoTower()
    counts = torch.zeros(task.spec.items, dtype=torch.long)
    counts[:300] = 5
    plan = TablePlan("item_emb", dim=32, new_dim=32, rows=task.spec.items, min_count=2, rows_kept=300, buckets=25)
    torch.manual_seed(0)
    original = task.build_model(dict(task.default_params)).item_emb.weight.detach().clone()
    torch.manual_seed(0)
    model, _, how = _resized(task, TrainParams.of(task), [plan], {"item_emb": counts})
    table = model.item_emb
    assert isinstance(table, HashedRows)
    assert table.inner.weight.shape == (325, 32)
    assert torch.equal(table.weight[:300], original[:300])  # the task's own init, not N(0, 1)
    assert table.weight.shape == (task.spec.items, 32)
    same = table.remap[300:]
    a, b = (same == same[0]).nonzero()[:2, 0] + 300
    assert torch.equal(table(torch.tensor([int(a)])), table(torch.tensor([int(b)])))
    assert "hashed into 25 buckets" in how


@pytest.mark.slow
def test_the_built_in_recommender_lands_near_its_true_rank_at_dim_64() -> None:
    task = proftune.load_task("implicit-two-tower")
    recs = proftune.recommend(task, device="cpu", optimizer_budget_s=0, embedding_budget_s=1800)
    row = recs.get("embedding_dim")
    rank = task.spec.rank
    assert rank <= row.value["user_emb"] <= rank + 2, row.reason
    assert rank <= row.value["item_emb"] <= rank + 2, row.reason
    assert row.value["item_bias"] == 1  # narrower than 8: left alone
    ev = row.evidence
    items = ev["tables"]["item_emb"]
    assert items["never_touched"] > 0  # the Zipf tail
    assert items["top10_share"] > 0.3
    assert items["zipf_exponent"] > 0.5
    assert items["hash_buckets"] is not None  # the long tail shares buckets
    assert ev["resized_macs"] < ev["original_macs"]
    assert ev["resized_metric"] >= ev["original_metric"] - 0.03, row.effect
