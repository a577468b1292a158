"""How often ``proftune diagnose`` names the right root cause first, on broken training runs built
from the problem classes of the training-diagnosis literature, and how often it raises a false
alarm on healthy ones.

Classes: AUTOTRAINER (Zhang et al., ICSE 2021: vanishing and exploding gradients, dying ReLU,
oscillating loss, slow convergence) and DeepDiagnosis (Wardat et al., ICSE 2022: eight symptoms,
among them exploding tensors, saturated activations, dead nodes, loss not decreasing), plus the
causes an engineer meets next (unshuffled data, batch norm over tiny batches, NaN ops, over-
fitting, a schedule without warm-up or decay). Every task has one known fault; models are MLPs,
CNNs and a small Transformer encoder on scikit-learn's bundled data (no downloads).

Per task: the expected cause, the top finding (warning or error: an info finding is not an alarm),
whether the expected cause is among the findings at all (any severity, consequences included),
and the seconds the diagnosis took (training, range test and probes). A healthy task passes when
no finding of warning or error severity is raised.

    python benchmarks/diagnose.py [--only NAME ...] [--seed 0] [--json out.json]

Neither paper's tool is a package that runs on PyTorch (both are Keras code), so their reported
figures are printed beside ours, not re-measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

import proftune
from proftune import Callback, FitState
from proftune.examples import TensorBatches
from proftune.examples._digits import DigitsCNN, DigitsMLP, DigitsTransformer
from proftune.examples._sklearn import load_split
from proftune.examples._wine import WineMLP
from proftune.task import ClassificationTask

SGD: dict[str, Any] = {"optimizer": "sgd", "momentum": 0.9, "lr": 0.1, "batch_size": 64}


# -- models and data ---------------------------------------------------------------------------------
def mlp(widths: Iterable[int], act: Callable[[], nn.Module] = nn.ReLU, *, out: int = 10,
        init_std: Callable[[int], float] | None = None) -> nn.Sequential:
    """Linear layers of ``widths`` (the first is the input width) with ``act`` between them."""
    widths = list(widths)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        lin = nn.Linear(a, b)
        if init_std is not None:
            nn.init.normal_(lin.weight, std=init_std(a))
            nn.init.zeros_(lin.bias)
        layers += [lin, act()]
    layers.append(nn.Linear(widths[-1], out))
    return nn.Sequential(*layers)


class Sqrt(nn.Module):
    """``sqrt(x)``: NaN wherever x < 0 (the bug: it should be ``sqrt(relu(x) + eps)``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


class PostLNTransformer(nn.Module):
    """Rows of an 8x8 image as 8 tokens through a post-LayerNorm encoder (the original Transformer
    layout, which needs warm-up: Xiong et al. 2020), mean-pooled into a classifier."""

    def __init__(self, *, d_model: int = 64, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d_model)
        self.pos = nn.Parameter(torch.zeros(1, 8, d_model))
        block = nn.TransformerEncoderLayer(d_model, 4, 2 * d_model, dropout=0.0, batch_first=True, norm_first=False)
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x) + self.pos).mean(dim=1))  # type: ignore[no-any-return]


def _raw_breast_cancer() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Breast cancer features as they come (areas in the thousands), same split as load_split."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    b = datasets.load_breast_cancer()
    x_tr, x_va, y_tr, y_va = train_test_split(np.asarray(b.data, dtype=np.float32), b.target.astype(np.int64),
                                              test_size=0.2, random_state=0, stratify=b.target)
    return torch.from_numpy(x_tr), torch.from_numpy(y_tr), torch.from_numpy(x_va), torch.from_numpy(y_va)


class _Data(ClassificationTask):
    """A classification task over fixed tensors."""

    default_params: ClassVar[dict[str, Any]] = dict(SGD)
    shuffle: ClassVar[bool] = True

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return load_split("digits")

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y, _, _ = self.tensors()
        return TensorBatches(x, y, batch_size, shuffle=self.shuffle)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        _, _, x, y = self.tensors()
        return TensorBatches(x, y, batch_size, shuffle=False)


class Schedule(Callback):
    """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``total`` steps."""

    def __init__(self, lr: float, *, warmup: int, total: int) -> None:
        self.lr, self.warmup, self.total = lr, warmup, total

    def on_step_start(self, state: FitState) -> None:
        assert state.optimizer is not None
        s = state.step + 1
        f = s / self.warmup if s <= self.warmup else 0.5 * (1 + math.cos(math.pi * min(1.0, (s - self.warmup) /
                                                                                    max(self.total - self.warmup, 1))))
        for g in state.optimizer.param_groups:
            g["lr"] = self.lr * f


# -- the tasks ----------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    model: str
    expected: str | None  # None: healthy
    task: Callable[[], proftune.Task]
    params: dict[str, Any] = field(default_factory=dict)
    epochs: int | None = None
    max_steps: int | None = None
    callbacks: Callable[[], list[Callback]] = list


def _task(base: type, name: str, params: dict[str, Any] | None = None, **attrs: Any) -> Callable[[], Any]:
    cls = type(name, (base,), {"name": name, **({"default_params": params} if params is not None else {}),
                               **attrs})
    return cls


def _deep_relu(self: Any, params: dict[str, Any]) -> nn.Module:
    return mlp([64] + [128] * 8, init_std=lambda fan_in: 3 * math.sqrt(2 / fan_in))


def _big_fc(self: Any, params: dict[str, Any]) -> nn.Module:
    model = DigitsCNN.build_model(self, params)
    with torch.no_grad():
        model[13].weight.mul_(100.0)  # the first Linear after the convolutions
    return model


def _dead(self: Any, params: dict[str, Any]) -> nn.Module:
    model = DigitsMLP.build_model(self, params)
    with torch.no_grad():
        model[0].bias.fill_(-10.0)
        model[3].bias.fill_(-10.0)
    return model


def _cnn_sqrt(self: Any, params: dict[str, Any]) -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), Sqrt(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(16 * 64, 10))


def _deep_sigmoid(self: Any, params: dict[str, Any]) -> nn.Module:
    return mlp([64] + [32] * 9, nn.Sigmoid)


def _tanh_bc(self: Any, params: dict[str, Any]) -> nn.Module:
    return mlp([30, 64, 64], nn.Tanh, out=2)


def _tiny_train(self: Any) -> Any:
    x, y, xv, yv = load_split("digits")
    return x[:80], y[:80], xv, yv


def _sorted(self: Any) -> Any:
    x, y, xv, yv = load_split("digits")
    order = torch.argsort(y, stable=True)
    return x[order], y[order], xv, yv


CASES: list[Case] = [
    # -- broken -----------------------------------------------------------------------------------
    Case("mlp-lr-10x", "MLP", "lr_too_high", _task(_Data, "mlp-lr-10x", {**SGD, "lr": 1.0},
                                                    build_model=DigitsMLP.build_model), epochs=3),
    Case("mlp-lr-1000x-small", "MLP", "lr_too_low",
         _task(_Data, "mlp-lr-small", {**SGD, "lr": 1e-4}, build_model=DigitsMLP.build_model), epochs=3),
    Case("mlp-unshuffled", "MLP", "unshuffled_data",
         _task(_Data, "mlp-unshuffled", dict(SGD), build_model=DigitsMLP.build_model, tensors=_sorted,
               shuffle=False), epochs=3),
    Case("mlp-deep-relu-3x-he", "MLP", "exploding_gradients",
         _task(_Data, "mlp-deep-3xhe", {"optimizer": "sgd", "lr": 0.05, "batch_size": 64},
               build_model=_deep_relu), epochs=3),
    Case("cnn-fc-100x-init", "CNN", "exploding_gradients",
         _task(_Data, "cnn-big-fc", dict(SGD), build_model=_big_fc, tensors=DigitsCNN._tensors,
               input_shape=(1, 8, 8)), epochs=2),
    Case("mlp-dead-relu", "MLP", "dead_units",
         _task(_Data, "mlp-dead", dict(SGD), build_model=_dead), epochs=2),
    Case("cnn-sqrt-nan", "CNN", "nan_inf",
         _task(_Data, "cnn-sqrt", dict(SGD), build_model=_cnn_sqrt, tensors=DigitsCNN._tensors,
               input_shape=(1, 8, 8)), epochs=1),
    Case("mlp-deep-sigmoid", "MLP", "vanishing_gradients",
         _task(_Data, "mlp-deep-sigmoid", dict(SGD), build_model=_deep_sigmoid), epochs=3),
    Case("mlp-tanh-raw-features", "MLP", "saturated_activations",
         _task(_Data, "bc-tanh-raw", {**SGD, "batch_size": 32}, build_model=_tanh_bc,
               tensors=lambda self: _raw_breast_cancer()), epochs=5),
    Case("mlp-memorise-80", "MLP", "overfitting",
         _task(_Data, "mlp-memorise", {"optimizer": "adamw", "lr": 3e-3, "batch_size": 16, "weight_decay": 0.0,
                                       "hidden": 512}, build_model=DigitsMLP.build_model, tensors=_tiny_train),
         epochs=40),
    Case("cnn-batchnorm-bs2", "CNN", "batchnorm_small_batch", lambda: DigitsCNN(), {"batch_size": 2},
         max_steps=200),
    Case("mlp-sgd-slow", "MLP", "slow_convergence",
         _task(_Data, "mlp-slow", {"optimizer": "sgd", "lr": 0.05, "batch_size": 64},
               build_model=DigitsMLP.build_model), epochs=10),
    Case("post-ln-transformer-no-warmup", "Transformer", "no_warmup",
         _task(DigitsTransformer, "post-ln", {"lr": 1e-2, "batch_size": 64, "optimizer": "adamw"},
               build_model=lambda self, params: PostLNTransformer()), epochs=3),
    Case("mlp-sgd-bs8-no-decay", "MLP", "no_lr_decay",
         _task(_Data, "mlp-no-decay", {**SGD, "lr": 0.05, "batch_size": 8}, build_model=DigitsMLP.build_model),
         epochs=3),
    Case("transformer-lr-100x", "Transformer", "lr_too_high", lambda: DigitsTransformer(), {"lr": 0.3}, epochs=3),
    # -- healthy ----------------------------------------------------------------------------------
    Case("digits-mlp (defaults)", "MLP", None, lambda: DigitsMLP()),
    Case("digits-cnn", "CNN", None, lambda: DigitsCNN(), epochs=3),
    Case("digits-transformer", "Transformer", None, lambda: DigitsTransformer(), epochs=5),
    Case("wine-mlp (defaults)", "MLP", None, lambda: WineMLP()),
    Case("mlp-sgd-warmup-cosine", "MLP", None,
         _task(_Data, "mlp-sched", dict(SGD), build_model=DigitsMLP.build_model), epochs=8,
         callbacks=lambda: [Schedule(0.1, warmup=20, total=8 * 23)]),
    Case("mlp-tanh-standardised", "MLP", None,
         _task(_Data, "bc-tanh", {**SGD, "batch_size": 32}, build_model=_tanh_bc,
               tensors=lambda self: load_split("breast_cancer")), epochs=5),
]


# -- what the literature reports ------------------------------------------------------------------------
LITERATURE = [
    ("AUTOTRAINER (ICSE 2021)", "495 models, 6 datasets: every problem detected (100%), no false positive; "
     "97.33% of the problems repaired, +47.08% accuracy on average"),
    ("AUTOTRAINER (TDSC 2024, extended)", "701 models: detection 100% without false positives; "
     "98.42% repaired, +36.42% accuracy"),
    ("DeepDiagnosis (ICSE 2022)", "444 models (53 real-world, 391 from AUTOTRAINER), 8 symptoms; more accurate "
     "than UMLAUT and DeepLocalize and faster than AUTOTRAINER at localizing (no single top-1 figure)"),
    ("DeepFD (ICSE 2022)", "correct diagnosis of 52% of faulty programs (best prior tool 27%)"),
]


def _flat(findings: list[Any]) -> list[Any]:
    out = []
    for f in findings:
        out.append(f)
        out.extend(getattr(f, "consequences", ()))
    return out


def run(case: Case, seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    report = proftune.diagnose(case.task(), case.params, epochs=case.epochs, max_steps=case.max_steps,
                               seed=seed, record=False, device="cpu", callbacks=case.callbacks())
    seconds = time.perf_counter() - t0
    alarms = [f for f in report.findings if f.severity in ("warning", "error")]
    top = alarms[0] if alarms else None
    found = [f.cause for f in _flat(report.findings)]
    return {"task": case.name, "model": case.model, "expected": case.expected or "(healthy)",
            "top": top.cause if top else None, "top_severity": top.severity if top else None,
            "top1": (top is not None and top.cause == case.expected) if case.expected else top is None,
            "found": case.expected in found if case.expected else None,
            "findings": [f"{f.cause}:{f.severity}" for f in _flat(report.findings)],
            "seconds": seconds, "summary": top.summary if top else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="run only these task names")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the rows to this file")
    parser.add_argument("--verbose", action="store_true", help="print the top finding's summary")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [c for c in CASES if not args.only or c.name in args.only]
    rows = []
    print(f"{'task':<24} {'model':<12} {'expected':<22} {'top finding':<26} {'top-1':>5} {'found':>5} {'s':>6}")
    for case in cases:
        r = run(case, args.seed)
        rows.append(r)
        top = f"{r['top']} ({r['top_severity']})" if r["top"] else "-"
        found = "" if r["found"] is None else ("yes" if r["found"] else "no")
        print(f"{r['task']:<24} {r['model']:<12} {r['expected']:<22} {top:<26} {'yes' if r['top1'] else 'NO':>5} "
              f"{found:>5} {r['seconds']:>6.1f}", flush=True)
        if args.verbose:
            print(f"    {r['summary']}\n    all: {', '.join(r['findings'])}")
    broken = [r for r in rows if r["expected"] != "(healthy)"]
    healthy = [r for r in rows if r["expected"] == "(healthy)"]
    print()
    if broken:
        print(f"broken tasks: {len(broken)}; top-1 cause right: {sum(r['top1'] for r in broken)}/{len(broken)} "
              f"({sum(r['top1'] for r in broken) / len(broken):.0%}); cause found at all: "
              f"{sum(bool(r['found']) for r in broken)}/{len(broken)}")
    if healthy:
        false = [r for r in healthy if not r["top1"]]
        print(f"healthy tasks: {len(healthy)}; false alarms (a warning or error): {len(false)}"
              + (f" ({', '.join(r['task'] + ': ' + str(r['top']) for r in false)})" if false else ""))
    secs = [r["seconds"] for r in rows]
    if secs:
        print(f"seconds per diagnosis (training + range test + probes): median {statistics.median(secs):.1f}, "
              f"max {max(secs):.1f}, total {sum(secs):.0f}")
    print("\nwhat the literature reports for its tools (from the papers, not re-measured):")
    for tool, text in LITERATURE:
        print(f"  {tool}: {text}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
