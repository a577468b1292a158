"""A plain training script as users write it, for ``benchmarks/script.py``: argparse flags, its own
loop, its validation figure printed each epoch and its held-out figure at the end (which nothing
selects on). Its default learning rate is far too low. Not proftune code: nothing here imports it."""

import argparse

import torch
from sklearn.datasets import load_digits

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, default=1e-5)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--weight-decay", type=float, default=0.0)
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

torch.manual_seed(args.seed)
X, y = load_digits(return_X_y=True)
X, y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))  # one fixed split for every run
X, y = X[perm], y[perm]
train, val, test = slice(0, 1000), slice(1000, 1400), slice(1400, None)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
for epoch in range(args.epochs):
    order = torch.randperm(1000)
    model.train()
    for i in range(0, 1000, args.batch_size):
        b = order[i:i + args.batch_size]
        loss = torch.nn.functional.cross_entropy(model(X[train][b]), y[train][b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(X[val]).argmax(1) == y[val]).float().mean().item()
    print(f"epoch {epoch} loss: {loss.item():.4f} val_acc: {acc:.4f}", flush=True)
with torch.no_grad():
    print(f"test_acc: {(model(X[test]).argmax(1) == y[test]).float().mean().item():.4f}")
