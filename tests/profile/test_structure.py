"""The model's structure table: per-module shapes, params and MACs, checked against torchinfo.

torchinfo (the anchor) counts params exactly as we do; its MACs are ``output[0] x params`` of each
leaf (bias included, conv: ``params x output spatial``), so the totals differ by terms that each
test states and checks exactly.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from proftune.exceptions import ConfigError
from proftune.profile import Structure, model_structure
from proftune.profile import count_model as count

torchinfo = pytest.importorskip("torchinfo")


def _torchinfo_by_name(model: nn.Module, example: object) -> tuple[object, dict[str, object]]:
    """torchinfo's summary and its first row per module path."""
    from proftune.profile._layers import module_names

    info = torchinfo.summary(model, input_data=example, verbose=0, depth=50)
    names = module_names(model)
    rows: dict[str, object] = {}
    for li in info.summary_list:
        name = names.get(id(li.module))
        if name is not None:
            rows.setdefault(name, li)
    return info, rows


class Attention(nn.Module):
    """A container that does a matmul itself (functionally), and has a child it never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)
        self.unused = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) @ self.k(x).transpose(-1, -2)


def test_tree_shapes_params_and_subtree_macs() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), Attention())
    x = torch.randn(2, 5, 4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    s = model_structure(model, x)
    assert [r.name for r in s.rows] == ["", "0", "1", "2", "2.q", "2.k", "2.unused"]
    assert s.row("0").input_shapes == [[2, 5, 4]]
    assert s.row("0").output_shapes == [[2, 5, 8]]
    assert s.row("2").output_shapes == [[2, 5, 5]]
    assert s.row("2.q").macs == 2 * 5 * 8 * 8
    # the container's matmul is its own; its subtree holds q, k and it
    assert s.row("2").macs == 2 * (2 * 5 * 8 * 8) + 2 * 5 * 5 * 8
    assert s.row("").macs == s.macs == count(model, x).macs == s.row("0").macs + s.row("2").macs
    assert s.row("2.unused").calls == 0
    assert s.row("2.unused").output_shapes == []
    assert s.row("2").params == 3 * 72
    assert s.row("2").own_params == 0
    assert s.params_total == sum(p.numel() for p in model.parameters())
    assert s.batch_size == 2
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert Structure.from_dict(s.to_dict()) == s


def test_kwargs_input_and_not_a_module() -> None:
    class Kw(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 2)

        def forward(self, *, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            return self.lin(x) * scale

    s = model_structure(Kw(), {"x": torch.randn(4, 3), "scale": 2.0})
    assert s.row("").input_shapes == [[4, 3], "float"]
    assert s.row("lin").output_shapes == [[4, 2]]
    with pytest.raises(ConfigError, match=r"torch\.nn\.Module"):
        model_structure("resnet", torch.randn(1))  # type: ignore[arg-type]


def test_resnet18_matches_torchinfo() -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 224, 224)
    s = model_structure(model, x)
    info, theirs = _torchinfo_by_name(model, x)
    ours = {r.name: r for r in s.rows}
    assert set(theirs) <= set(ours)
    for name, li in theirs.items():
        assert ours[name].params == li.num_params, name  # type: ignore[attr-defined]
        if ours[name].type == "Conv2d":  # bias-free convs: one convention
            assert ours[name].macs == li.macs, name  # type: ignore[attr-defined]
        assert ours[name].output_shapes[0] == list(li.output_size), name  # type: ignore[attr-defined]
    assert s.params_total == info.total_params == 11_689_512  # type: ignore[attr-defined]
    # torchinfo adds batch x params for BatchNorm (weight, bias) and the fc bias; we count those 0
    bn = sum(2 * m.num_features for m in model.modules() if isinstance(m, nn.BatchNorm2d))
    assert s.macs == info.total_mult_adds - bn - model.fc.out_features  # type: ignore[attr-defined]
    assert s.macs == 1_814_073_344


@pytest.mark.slow
def test_bert_base_matches_torchinfo() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig()  # BERT-base: 12 layers, hidden 768, random weights
    model = transformers.BertModel(cfg).eval()
    batch, length = 2, 64
    ids = torch.randint(0, cfg.vocab_size, (batch, length))
    example = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    s = model_structure(model, example)
    info, theirs = _torchinfo_by_name(model, example)
    ours = {r.name: r for r in s.rows}
    for name, li in theirs.items():
        assert ours[name].params == li.num_params, name  # type: ignore[attr-defined]
    assert s.params_total == info.total_params == 109_482_240  # type: ignore[attr-defined]
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    for name, lin in linears.items():
        rows = length if name != "pooler.dense" else 1  # the pooler sees the first token only
        assert ours[name].macs == batch * rows * lin.in_features * lin.out_features, name
        # torchinfo: batch x (weights + bias) -- no sequence length
        assert theirs[name].macs == batch * (lin.in_features + 1) * lin.out_features, name  # type: ignore[attr-defined]
    attention = cfg.num_hidden_layers * 2 * batch * length * length * cfg.hidden_size  # QK^T and AV
    assert s.macs == sum(ours[n].macs for n in linears) + attention
