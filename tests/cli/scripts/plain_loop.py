"""A plain PyTorch training loop on sklearn's digits, as a user writes it (no proftune in it)."""

import argparse
import sys

import torch
from sklearn.datasets import load_digits
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--crash-at", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--eval", action="store_true", help="inference only, no optimizer")
args = parser.parse_args()

torch.manual_seed(0)
digits = load_digits()
x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
y = torch.tensor(digits.target)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


model = build_model()
if args.eval:
    model.eval()
    with torch.no_grad():
        for i in range(args.steps):
            j = (i * args.batch_size) % (len(x) - args.batch_size)
            model(x[j:j + args.batch_size])
    sys.exit(args.exit_code)

opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(args.steps):
    if i == args.crash_at:
        raise RuntimeError(f"crash at step {i}")
    j = (i * args.batch_size) % (len(x) - args.batch_size)
    loss = nn.functional.cross_entropy(model(x[j:j + args.batch_size]), y[j:j + args.batch_size])
    opt.zero_grad()
    loss.backward()
    opt.step()
print("final loss", float(loss))
sys.exit(args.exit_code)
