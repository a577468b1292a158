"""A Hugging Face Trainer script as users write it, for issue 61: argparse flags, a small model on
sklearn's digits returning ``{"loss", "logits"}`` as the Trainer accepts (a tiny BERT built from its
config, reading the 64 pixels as tokens, reached 0.34 in 5 epochs at its best rate: too slow to
learn for a test), ``transformers.Trainer`` with ``eval_strategy="epoch"`` and a ``compute_metrics``
giving accuracy (``eval_accuracy``), the held-out ``test_acc`` printed at the end. Its default
learning rate is far too low. Not proftune code: nothing imports it."""

import argparse

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from transformers import Trainer, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--lr", "--learning-rate", dest="learning_rate", type=float, default=1e-5)
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--weight-decay", type=float, default=0.0)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--output-dir", default="hf_out")
args = p.parse_args()


class Digits(torch.utils.data.Dataset):
    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict:
        return {"pixels": self.x[i], "labels": self.y[i]}


class DigitsMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, pixels: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.net(pixels)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


def compute_metrics(pred) -> dict:
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


X, y = load_digits(return_X_y=True)
perm = np.random.default_rng(1234).permutation(len(y))  # one fixed split for every run
X, y = X[perm], y[perm]
train, val, test = (Digits(X[s], y[s]) for s in (slice(0, 1000), slice(1000, 1400), slice(1400, None)))

torch.manual_seed(args.seed)
model = DigitsMLP()
training_args = TrainingArguments(
    output_dir=args.output_dir, learning_rate=args.learning_rate, per_device_train_batch_size=args.batch_size,
    per_device_eval_batch_size=200, weight_decay=args.weight_decay, num_train_epochs=args.epochs,
    seed=args.seed, eval_strategy="epoch", save_strategy="no", logging_strategy="epoch", report_to="none",
    use_cpu=True, disable_tqdm=True)
trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=val,
                  compute_metrics=compute_metrics)
trainer.train()
test_acc = trainer.predict(test).metrics["test_accuracy"]
print(f"test_acc: {test_acc:.4f}")
