"""Hugging Face models count and profile correctly: params, MACs (attention included, SDPA and
eager), embeddings as params without MACs, dict batches and ModelOutput losses. Random weights
from configs: nothing is downloaded."""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from proftune import profile  # noqa: E402
from proftune.profile import count_model  # noqa: E402


def bert_closed_form(cfg: Any, seq: int) -> int:
    """MACs of BERT's encoder per sequence: Q, K, V and output projections, QK^T and AV, the
    feed-forward, in every layer, plus the pooler's dense layer on one token."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    per_layer = 4 * seq * h * h + 2 * seq * h * i + 2 * seq * seq * h
    return cfg.num_hidden_layers * per_layer + h * h


def gpt2_closed_form(cfg: Any, seq: int) -> int:
    """MACs of GPT-2 per sequence: attention and MLP in every layer, plus the (tied) LM head."""
    h = cfg.n_embd
    inner = cfg.n_inner or 4 * h
    per_layer = 4 * seq * h * h + 2 * seq * h * inner + 2 * seq * seq * h
    return cfg.n_layer * per_layer + seq * h * cfg.vocab_size


def tokens(vocab: int, seq: int, batch: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g),
            "attention_mask": torch.ones(batch, seq, dtype=torch.long)}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_small_bert_macs_match_the_closed_form(attn: str) -> None:
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                                  intermediate_size=512, attn_implementation=attn)
    model = transformers.BertModel(cfg).eval()
    counts = count_model(model, tokens(cfg.vocab_size, 32))
    assert counts.macs == pytest.approx(bert_closed_form(cfg, 32), rel=0.01)
    assert counts.by_type["Embedding"].macs == 0
    assert counts.by_type["Embedding"].params == (cfg.vocab_size + cfg.max_position_embeddings
                                                  + cfg.type_vocab_size) * 128


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_small_gpt2_macs_match_the_closed_form_and_tied_head_counts_once(attn: str) -> None:
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64,
                                  attn_implementation=attn)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    counts = count_model(model, tokens(cfg.vocab_size, 16))
    assert counts.macs == pytest.approx(gpt2_closed_form(cfg, 16), rel=0.01)
    assert counts.params_total == sum(p.numel() for p in model.transformer.parameters())  # head tied


def test_profile_a_hf_model_on_a_dict_batch_uses_its_own_loss() -> None:
    cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=100, num_labels=3)
    model = transformers.BertForSequenceClassification(cfg)
    batch = {**tokens(100, 8, batch=4), "labels": torch.tensor([0, 1, 2, 0])}
    p = profile(model, example_input=batch, steps=1, warmup=0, device="cpu")
    assert p.params.total == sum(q.numel() for q in model.parameters())
    assert p.macs == pytest.approx(4 * bert_closed_form(cfg, 8) + 4 * 32 * 3, rel=0.01)
    assert p.grad.norm is not None
    assert p.grad.norm > 0


@pytest.mark.slow
def test_bert_base_params_and_macs() -> None:
    cfg = transformers.BertConfig()
    model = transformers.BertModel(cfg).eval()
    counts = count_model(model, tokens(cfg.vocab_size, 128))
    assert counts.params_total == 109_482_240
    assert counts.macs == pytest.approx(bert_closed_form(cfg, 128), rel=0.01)


@pytest.mark.slow
def test_gpt2_small_params_and_macs() -> None:
    cfg = transformers.GPT2Config()
    model = transformers.GPT2LMHeadModel(cfg).eval()
    counts = count_model(model, tokens(cfg.vocab_size, 128))
    assert counts.params_total == 124_439_808
    assert counts.macs == pytest.approx(gpt2_closed_form(cfg, 128), rel=0.01)


def test_a_hf_model_factory_is_a_task_by_file_name() -> None:
    from pathlib import Path

    from proftune import load_task
    from proftune.integrations import HFModelTask

    task = load_task(f"{Path(__file__).parent / 'hf_tiny.py'}:tiny_bert")
    assert isinstance(task, HFModelTask)
    assert task.name == "tiny_bert"
    batch = next(iter(task.train_data(4, {})))
    assert batch["input_ids"].shape == (4, 100 if task.seq_len == 100 else task.seq_len)
    assert batch["labels"].max() < 3  # labels for its 3-class head
    p = profile(task, batch_size=4, steps=1, warmup=0, device="cpu")
    cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    assert p.macs == pytest.approx(4 * bert_closed_form(cfg, task.seq_len) + 4 * 32 * 3, rel=0.01)
