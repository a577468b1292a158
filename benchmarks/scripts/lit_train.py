"""A Lightning training script as users write it, for issue 61 (``benchmarks/script.py --script lit``
and ``tests/script/test_lightning_script.py``): a LightningModule on digits, argparse flags,
``self.log("val_acc", ...)`` each validation, Lightning's ``CSVLogger`` writing them to
``LOG_DIR/digits/version_N/metrics.csv``, ``trainer.test``'s ``test_acc`` logged there too and printed
at the end. Its default learning rate is far too low. Not proftune code: nothing imports it."""

import argparse

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=1e-5)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--weight-decay", type=float, default=0.0)
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--log-dir", default="lit_logs")
args = p.parse_args()


class DigitsMLP(L.LightningModule):
    def __init__(self, lr: float, weight_decay: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


L.seed_everything(args.seed, verbose=False)
X, y = load_digits(return_X_y=True)
X, y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))  # one fixed split for every run
X, y = X[perm], y[perm]
train, val, test = (TensorDataset(X[s], y[s]) for s in (slice(0, 1000), slice(1000, 1400), slice(1400, None)))
trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=CSVLogger(args.log_dir, name="digits"),
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
model = DigitsMLP(args.lr, args.weight_decay)
trainer.fit(model, DataLoader(train, batch_size=args.batch_size, shuffle=True), DataLoader(val, batch_size=400))
result = trainer.test(model, DataLoader(test, batch_size=400), verbose=False)
print(f"test_acc: {result[0]['test_acc']:.4f}")
