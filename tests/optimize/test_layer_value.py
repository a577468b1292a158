"""A layer's worth measured whatever its output's structure (issue 60): an RNN's ``(output, h)``,
a PackedSequence, a dict; a layer whose output cannot be replaced is reported as not measured,
never as worth 0; and no advice removes a layer the model cannot work without (a GRU that carries
a motif task once read "costs only 0 accuracy" and was advised for removal)."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import proftune
from proftune.examples import TensorBatches
from proftune.optimize._layer_value import MeanAblation, keep_layers, layer_values
from proftune.profile import LayerProfile, Profile
from proftune.train import fit

MOTIF = (0, 1, 2)


@cache
def _motifs(n: int = 600, length: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One-hot sequences of 4 symbols; label 1 where the motif 0,1,2 occurs, half of them."""
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for i in range(n):
        while True:
            seq = torch.randint(0, 4, (length,), generator=g)
            if i % 2 == 1:
                at = int(torch.randint(0, length - len(MOTIF) + 1, (1,), generator=g))
                seq[at:at + len(MOTIF)] = torch.tensor(MOTIF)
            has = any(tuple(seq[j:j + len(MOTIF)].tolist()) == MOTIF for j in range(length - len(MOTIF) + 1))
            if has == bool(i % 2):
                break
        xs.append(nn.functional.one_hot(seq, 4).float())
        ys.append(i % 2)
    return torch.stack(xs), torch.tensor(ys)


class _GRUNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(4, 24, batch_first=True)
        self.head = nn.Linear(24, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _out, h = self.rnn(x)  # a tuple: the hook must reach h inside it
        return self.head(h[-1])  # type: ignore[no-any-return]


class MotifGRU(proftune.ClassificationTask):
    """A GRU that carries the model: only through it does the head see the sequence."""

    name = "motif-gru"
    default_params: ClassVar[dict[str, Any]] = {"lr": 3e-2, "batch_size": 16, "optimizer": "adam"}
    default_epochs: ClassVar[int] = 25

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _GRUNet()

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Any:
        x, y = _motifs()
        return TensorBatches(x[:400], y[:400], batch_size, shuffle=True)

    def val_data(self, batch_size: int) -> Any:
        x, y = _motifs()
        return TensorBatches(x[400:], y[400:], batch_size, shuffle=False)


@pytest.fixture(scope="module")
def trained() -> tuple[MotifGRU, nn.Module, proftune.Profile]:
    task = MotifGRU()
    result = fit(task, dict(task.default_params), epochs=task.default_epochs, device="cpu", seed=0)
    assert result.metrics["accuracy"] >= 0.8, result.metrics  # the GRU learned the motif
    prof = proftune.profile(task, device="cpu")
    return task, result.model, prof


def test_the_layer_that_carries_the_model_is_measured_and_kept(
        trained: tuple[MotifGRU, nn.Module, proftune.Profile]) -> None:
    task, model, prof = trained
    base, values, notes = layer_values(task, model, metric="accuracy", higher_is_better=True, profile=prof,
                                       device=torch.device("cpu"), batch_size=32)
    rnn = next(v for v in values if v.name == "rnn")
    assert rnn.measured
    assert rnn.drop > 0.25, (base, rnn)  # without it the head sees one sequence for all: chance
    assert rnn.finding is None, rnn.finding
    assert rnn.essential
    assert "only recurrent layer" in (rnn.note or "")
    assert "rnn" in keep_layers(values)
    assert any(n.startswith("rnn (GRU) is kept whole") for n in notes), notes


class _Counts(nn.Module):
    """A layer whose output holds no floating tensor: its worth cannot be measured by a mean."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.scale).argmax(-1)


class _CountsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.counts = _Counts()
        self.head = nn.Embedding(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.counts(x)).mean(1)  # type: ignore[no-any-return]


def test_a_layer_whose_output_cannot_be_replaced_is_not_measured_visibly() -> None:
    task = MotifGRU()
    _base, values, notes = layer_values(task, _CountsNet(), metric="accuracy", higher_is_better=True, profile=None,
                                        device=torch.device("cpu"), batch_size=32)
    counts = next(v for v in values if v.name == "counts")
    assert not counts.measured
    assert counts.finding is None
    assert "no floating tensor" in (counts.note or "")
    assert any("counts (_Counts) not measured" in n for n in notes), notes


def test_the_mean_reaches_tensors_in_any_structure() -> None:
    x = torch.randn(5, 7, 4)
    gru = nn.LSTM(4, 3, batch_first=False)  # (T=5, B=7, F): the batch is the second dimension
    hook = MeanAblation()
    out, (h, c) = hook(gru, (x,), gru(x))
    assert hook.ablated == 3
    for t in (out, h, c):
        assert torch.allclose(t, t[:, :1].expand_as(t))  # one value over the batch
    assert not torch.allclose(out, out[:1].expand_as(out))  # not over time
    packed = pack_padded_sequence(torch.randn(6, 3, 4), torch.tensor([3, 2, 2, 1, 1, 1]), batch_first=True)
    hook = MeanAblation()
    p_out, _ = hook(gru, (packed,), gru(packed))
    assert torch.allclose(p_out.data, p_out.data[:1].expand_as(p_out.data))
    lin = nn.Linear(4, 2)
    hook = MeanAblation()
    d = hook(lin, (torch.randn(8, 4),), {"logits": torch.randn(8, 2), "ids": torch.arange(8)})
    assert torch.allclose(d["logits"], d["logits"][:1].expand_as(d["logits"]))
    assert torch.equal(d["ids"], torch.arange(8))  # not floating: left as it is
    assert hook.ablated == 1


def test_a_layer_states_its_cost_only_where_its_share_is_beyond_the_loads_noise() -> None:
    """Issue 63: under load the layer-value stage read one Linear at 37% of the step and stated a
    finding a quiet run does not. Three layers worth nothing (the first one's output is constant),
    each at about 40% of the step: the one timed on three steps is stated (its share at its fastest:
    a busy machine only adds time), the two timed on one step each are not."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(32, 16), nn.Linear(16, 16), nn.Linear(16, 2))
    with torch.no_grad():
        model[1].weight.zero_()  # the rest sees one input for every sample: every drop is 0
    steady = LayerProfile("3", "Linear", params=34, time_share=0.40, time_share_second=0.41,
                          time_share_median=0.42, time_share_q1=0.41, time_share_q3=0.44, time_share_samples=3)
    moved = dataclasses.replace(steady, name="1", params=528, time_share_second=None, time_share_q1=None,
                                time_share_q3=None, time_share_samples=1)
    once = dataclasses.replace(steady, name="2", params=272, time_share_q1=None, time_share_q3=None,
                               time_share_second=None, time_share_samples=1)
    prof = Profile(layers=(moved, once, steady))
    _base, values, notes = layer_values(MotifGRU(), model, metric="accuracy", higher_is_better=True, profile=prof,
                                        device=torch.device("cpu"), batch_size=32)
    by_name = {v.name: v for v in values}
    assert [v.drop for v in values] == [0.0, 0.0, 0.0]
    assert by_name["3"].finding is not None
    assert "takes 40% of the step time (fastest of 3 steps; their middle half took 1.0-1.1x as long)" in (
        by_name["3"].finding)
    assert (by_name["3"].time_share_q1, by_name["3"].time_share_q3) == (0.41, 0.44)
    assert by_name["1"].finding is None
    assert by_name["2"].finding is None
    assert any(n.startswith("1 (Linear): no finding from its 40% of the step time (within noise: timed on 1 "
                            "step)") for n in notes), notes
    assert any(n.startswith("2 (Linear): no finding") and "timed on 1 step" in n for n in notes), notes
    # a steady share under the bar (9% at its fastest) states nothing either, whatever its slower steps
    low = dataclasses.replace(steady, time_share=0.09, time_share_second=0.10, time_share_median=0.11,
                              time_share_q1=0.10, time_share_q3=0.13)
    _base, values, notes = layer_values(MotifGRU(), model, metric="accuracy", higher_is_better=True,
                                        profile=Profile(layers=(low,)), device=torch.device("cpu"), batch_size=32)
    assert [v.finding for v in values] == [None]
    assert [v.time_share for v in values] == [0.09]
