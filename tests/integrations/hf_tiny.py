"""A Hugging Face model factory, as a user's file names one: `proftune profile hf_tiny.py:tiny_bert`."""

from __future__ import annotations

from transformers import BertConfig, BertForSequenceClassification


def tiny_bert() -> BertForSequenceClassification:
    return BertForSequenceClassification(BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                                    intermediate_size=64, vocab_size=100, num_labels=3))
