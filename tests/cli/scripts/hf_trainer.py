"""A Hugging Face `Trainer` script: a tiny BERT built from its config (random weights, no hub)."""

import sys

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

torch.manual_seed(0)
config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(config)
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 128, (128, 16), generator=g)
labels = torch.randint(0, 2, (128,), generator=g)
data = [{"input_ids": ids[i], "attention_mask": torch.ones(16, dtype=torch.long), "labels": labels[i]}
        for i in range(len(ids))]
args = TrainingArguments(output_dir=sys.argv[1], per_device_train_batch_size=8, num_train_epochs=1,
                         report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                         disable_tqdm=True, dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=data).train()
