"""The index stream of embedding tables and the spectrum of what they learned."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from proftune.examples import TensorBatches
from proftune.profile import (
    IndexCounter,
    embedding_tables,
    index_stats,
    table_spectrum,
    zipf_exponent,
)
from proftune.task import Task
from proftune.train import fit


def test_index_stats_of_known_counts() -> None:
    # 1000 rows: rows 0..9 read 100 times each, rows 10..99 once, the rest never
    counts = torch.zeros(1000, dtype=torch.long)
    counts[:10] = 100
    counts[10:100] = 1
    st = index_stats("t", counts, 16)
    assert st.rows == 1000
    assert st.lookups == 1090
    assert st.never_touched == 900
    assert st.never_touched_share == pytest.approx(0.9)
    assert st.top1_share == pytest.approx(1000 / 1090)  # the top 10 rows (1%)
    assert st.top10_share == pytest.approx(1.0)  # the top 100 rows hold every lookup
    assert st.rows_for_99 == 90  # 1000 + 80 = 1080 lookups >= 99% of 1090 = 1079.1; 79 more fall short
    assert st.count_at_99 == 1


def test_zipf_exponent_recovers_the_exponent_of_exact_zipf_counts() -> None:
    ranks = torch.arange(1, 501, dtype=torch.float64)
    for s in (0.8, 1.0, 1.3):
        counts = (1e6 * ranks.pow(-s)).round().long()
        fitted, r2 = zipf_exponent(counts)
        assert fitted == pytest.approx(s, abs=0.02)
        assert r2 is not None
        assert r2 > 0.99
    assert zipf_exponent(torch.tensor([3, 2, 1, 0])) == (None, None)  # too few counted rows


def test_the_spectrum_finds_the_rank_of_a_low_rank_table_under_noise() -> None:
    gen = torch.Generator().manual_seed(0)
    rows, dim, rank = 2000, 64, 6
    signal = torch.randn(rows, rank, generator=gen) @ torch.randn(rank, dim, generator=gen)
    table = signal + 0.3 * torch.randn(rows, dim, generator=gen)
    sp = table_spectrum("t", table)
    assert sp.signal_rank == rank
    assert sp.signal_dims["99%"] <= rank
    assert rank - 1 <= sp.signal_dims["95%"] <= rank
    assert sp.energy_dims["99%"] > rank  # the noise holds energy in every column
    assert 1.0 <= sp.stable_rank <= rank
    assert len(sp.singular_values) == dim
    # rows never read are left out: a table of untouched random rows adds nothing
    padded = torch.cat([table, torch.randn(3000, dim, generator=gen)])
    counts = torch.cat([torch.ones(rows, dtype=torch.long), torch.zeros(3000, dtype=torch.long)])
    assert table_spectrum("t", padded, counts).rows_used == rows
    assert table_spectrum("t", padded, counts).signal_rank == rank


class _Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.EmbeddingBag(50, 8, mode="mean")
        self.users = nn.Embedding(20, 4)
        self.head = nn.Linear(12, 2)

    def forward(self, tokens: torch.Tensor, users: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.tokens(tokens), self.users(users)], dim=1))


class _BagTask(Task):
    default_params = {"batch_size": 10, "lr": 1e-2}  # noqa: RUF012

    def build_model(self, params: dict) -> nn.Module:  # type: ignore[type-arg]
        return _Bag()

    def _data(self) -> TensorBatches:
        tokens = torch.arange(40 * 3).reshape(40, 3) % 30  # rows 30..49 never read
        users = torch.arange(40) % 20
        y = torch.stack([tokens, users.unsqueeze(1).expand(-1, 3)])  # (features) carried as one tensor
        return TensorBatches(y.permute(1, 0, 2), torch.arange(40) % 2, 10, shuffle=False)

    def train_data(self, batch_size: int, params: dict) -> TensorBatches:  # type: ignore[type-arg]
        return self._data()

    def val_data(self, batch_size: int) -> TensorBatches:
        return self._data()

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x[:, 0], x[:, 1, 0]), y)


def test_the_index_counter_counts_training_lookups_of_every_table_and_not_evaluation() -> None:
    counter = IndexCounter(epochs=1)
    fit(_BagTask(), max_steps=4, epochs=2, device="cpu", callbacks=[counter])  # evaluation runs too
    assert set(counter.counts) == {"tokens", "users"}
    tokens = counter.counts["tokens"]
    assert int(tokens.sum()) == 4 * 10 * 3  # 4 steps of 10 bags of 3 tokens; no eval lookups
    assert int((tokens[30:] > 0).sum()) == 0
    assert int(counter.counts["users"].sum()) == 40
    assert counter.dims == {"tokens": 8, "users": 4}
    assert set(embedding_tables(_Bag())) == {"tokens", "users"}
