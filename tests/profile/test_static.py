"""Static accounting: parameters, MACs and FLOPs against formulas written out by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from proftune.profile import count_model, count_params


def test_linear_and_conv_match_hand_formulas() -> None:
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
    counts = count_model(model, torch.randn(2, 3, 6, 6))
    conv_macs = 2 * 8 * 6 * 6 * (3 * 3 * 3)  # batch x out channels x positions x kernel volume
    linear_macs = 2 * 5 * (8 * 6 * 6)
    assert counts.layers["0"].macs == conv_macs
    assert counts.layers["3"].macs == linear_macs
    assert counts.macs == conv_macs + linear_macs
    assert counts.flops == 2 * counts.macs
    assert counts.params_total == sum(p.numel() for p in model.parameters())
    assert counts.by_type["Conv2d"].macs == conv_macs


def test_sdpa_counted_on_cpu() -> None:
    class Attn(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v)

    b, h, lq, lk, e = 2, 4, 8, 12, 16
    q, k, v = torch.randn(b, h, lq, e), torch.randn(b, h, lk, e), torch.randn(b, h, lk, e)
    counts = count_model(Attn(), (q, k, v))
    # Q K^T and softmax(.) V: two batched matmuls of b*h*lq*lk*e MACs each
    assert counts.macs == 2 * b * h * lq * lk * e
    assert counts.macs > 0  # FlopCounterMode alone reports 0 on CPU


def test_multihead_attention_macs() -> None:
    b, seq, d, heads = 3, 10, 32, 4
    mha = nn.MultiheadAttention(d, heads, batch_first=True)

    class Wrap(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = mha

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.attn(x, x, x, need_weights=False)[0]

    counts = count_model(Wrap(), torch.randn(b, seq, d))
    # eval mode under no_grad takes the fused _native_multi_head_attention path: same count
    assert count_model(Wrap().eval(), torch.randn(b, seq, d)).macs == counts.macs
    projections = 4 * b * seq * d * d  # q, k, v in-projection and the output projection
    attention = 2 * b * seq * seq * d  # QK^T and AV over all heads (heads x head_dim = d)
    assert counts.layers["attn"].macs == projections + attention
    # out_proj is applied functionally: its parameters fold into the attention layer
    assert counts.layers["attn"].params == sum(p.numel() for p in mha.parameters())


@pytest.mark.parametrize(("cls", "gates"), [(nn.LSTM, 4), (nn.GRU, 3), (nn.RNN, 1)])
def test_recurrent_layers(cls: type, gates: int) -> None:
    b, t, n_in, hidden = 3, 7, 16, 32
    rnn = cls(n_in, hidden, num_layers=2, batch_first=True, bidirectional=True)
    counts = count_model(rnn, torch.randn(b, t, n_in))
    layer0 = 2 * gates * hidden * (n_in + hidden)  # two directions
    layer1 = 2 * gates * hidden * (2 * hidden + hidden)  # input is both directions' outputs
    assert counts.macs == b * t * (layer0 + layer1)


def test_lstm_cell_counted_once() -> None:
    cell = nn.LSTMCell(10, 20)
    counts = count_model(cell, torch.randn(4, 10))
    assert counts.macs == 4 * 4 * 20 * (10 + 20)


def test_embedding_params_and_zero_macs() -> None:
    model = nn.Sequential(nn.Embedding(100, 16), nn.Flatten(), nn.Linear(16 * 5, 2))
    counts = count_model(model, torch.randint(0, 100, (4, 5)))
    assert counts.layers["0"].params == 1600
    assert counts.layers["0"].macs == 0  # a lookup, not a multiply-accumulate
    assert counts.macs == 4 * 2 * 80


def test_shared_weights_counted_once() -> None:
    lin = nn.Linear(8, 8)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    total, trainable = count_params(model)
    assert total == trainable == 72
    counts = count_model(model, torch.randn(2, 8))
    assert counts.params_total == 72
    assert sum(layer.params for layer in counts.layers.values()) == 72
    assert counts.macs == 2 * 2 * 64  # applied twice


def test_frozen_params_not_trainable() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)
    total, trainable = count_params(model)
    assert total == 30
    assert trainable == 14


def test_backward_roughly_twice_forward() -> None:
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    x = torch.randn(16, 64, requires_grad=True)
    counts = count_model(model, x, backward=True)
    assert 1.5 * counts.flops <= counts.backward_flops <= 2.0 * counts.flops
    assert all(p.grad is None for p in model.parameters())  # no trace left behind


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2"])
def test_torchvision_published_figures(name: str) -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.get_model(name, weights=None)
    meta = torchvision.models.get_model_weights(name).DEFAULT.meta
    counts = count_model(model.eval(), torch.randn(1, 3, 224, 224))
    assert counts.params_total == meta["num_params"]
    assert counts.macs / 1e9 == pytest.approx(meta["_ops"], rel=0.01)


class _Fn(nn.Module):
    """A layer that applies one tensor function to its input, with its own weights."""

    def __init__(self, fn: object) -> None:
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.randn(5))
        self.m = nn.Parameter(torch.randn(6, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self, x)  # type: ignore[operator]


@pytest.mark.parametrize(("form", "fn", "shape", "macs"), [
    # a 3-D x 1-D matmul runs as an mv on (3*4, 5): numel(out) x k
    ("matmul 3-D x 1-D", lambda s, x: torch.matmul(x, s.w), (3, 4, 5), 3 * 4 * 5),
    ("mv", lambda s, x: torch.mv(s.m, x), (5,), 6 * 5),
    ("addmv", lambda s, x: torch.addmv(torch.zeros(6), s.m, x), (5,), 6 * 5),
    ("dot", lambda s, x: torch.dot(x, s.w), (5,), 5),
    ("matmul 1-D x 1-D", lambda s, x: torch.matmul(x, s.w), (5,), 5),
    ("vdot", lambda s, x: torch.vdot(x, s.w), (5,), 5),
    ("addr (outer)", lambda s, x: torch.addr(torch.zeros(5, 5), x, s.w), (5,), 5 * 5),
    ("addbmm", lambda s, x: torch.addbmm(torch.zeros(4, 6), x, s.m.t().expand(3, 5, 6)), (3, 4, 5), 3 * 4 * 5 * 6),
    ("einsum ij,j->i", lambda s, x: torch.einsum("ij,j->i", s.m, x), (5,), 6 * 5),
    ("einsum bij,j->bi", lambda s, x: torch.einsum("bij,j->bi", x, s.w), (3, 4, 5), 3 * 4 * 5),
    ("tensordot", lambda s, x: torch.tensordot(x, s.m.t(), dims=1), (3, 4, 5), 3 * 4 * 5 * 6),
    ("bilinear", lambda s, x: F.bilinear(x, x, s.m.reshape(6, 5, 1).expand(6, 5, 5)), (2, 5), 2 * 6 * 5 * 5),
])
def test_every_matmul_form_is_counted(form: str, fn: object, shape: tuple[int, ...], macs: int) -> None:
    counts = count_model(_Fn(fn), torch.randn(*shape), backward=True)
    assert counts.macs == macs, form
    assert counts.flops == 2 * macs, form
    assert counts.uncounted_ops == [], (form, counts.uncounted_ops)  # forward and backward
