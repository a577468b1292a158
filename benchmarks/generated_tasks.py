"""Tasks drawn from a space, so that no mechanism can be fitted to them by hand (issue 60).

``draw_tasks(seed, n)`` draws ``n`` tasks, each a :class:`proftune.Task` with train / val / test
splits (``test_data`` is what every arm is judged on; nothing selects on it) and a readable
``description`` of what was drawn:

- data: sklearn's digits (8x8, or upsampled to 16x16 / 32x32 images), wine, breast cancer,
  covtype-like tables (``make_classification``), generated sequences (motif detection) and
  generated images (bars, crosses and squares in noise); 50..5000 training samples where the
  data has them, label noise on the training labels;
- a model matched to the data: an MLP or a BatchNorm residual MLP on tables, a CNN or an MLP on
  images, a GRU, an LSTM or a small transformer on sequences;
- the user's own ``configure_optimizer`` / ``configure_scheduler`` (SGD with momentum and a
  cosine or step schedule, Adam with coupled L2, AdamW) or the fit loop's;
- one or two mistakes in the defaults, each of a drawn size: lr x1/100..x100, batch x1/8..x8 or
  beyond the data, over- or under-regularised, too few epochs, a plateau start.

Every draw is deterministic in ``(seed, index)``: ``draw_tasks(s, 6)[:3] == draw_tasks(s, 3)``.
The cost of one training of the defaults is estimated from a per-step cost model (fixed numbers,
so the draw does not depend on the machine); ``max_training_s`` caps it by shrinking the training
set, then the epochs (the description says so).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import numpy as np
import torch
from headroom_tasks import Split, _split, _Split3
from torch import nn

import proftune
from proftune.examples import TensorBatches

#: What the draws cover; the test checks that 60 draws reach every one.
DATA_KINDS = ("digits8", "digits16", "digits32", "wine", "cancer", "table", "sequences", "images")
MODEL_KINDS = ("mlp", "resmlp", "cnn", "gru", "lstm", "transformer")
OPTIMIZER_KINDS = ("fit", "sgd-cosine", "sgd-step", "adam-l2", "adamw")
MISTAKE_KINDS = ("lr-high", "lr-low", "batch-big", "batch-small", "over-reg", "under-reg", "few-epochs", "plateau")
_MODELS_FOR = {"digits8": ("mlp", "resmlp", "cnn"), "digits16": ("cnn", "mlp"), "digits32": ("cnn",),
               "wine": ("mlp", "resmlp"), "cancer": ("mlp", "resmlp"), "table": ("mlp", "resmlp"),
               "sequences": ("gru", "lstm", "transformer"), "images": ("cnn", "mlp")}
#: The longest training of the defaults the space holds (estimated s); ``max_training_s`` caps lower.
SPACE_MAX_S = 30.0
_CONFLICTS = ({"lr-high", "lr-low"}, {"batch-big", "batch-small"}, {"over-reg", "under-reg"})
#: The width parameter each model reads (the one Optuna's space scales, benchmarks/optimize.py).
_WIDTH_KEY = {"mlp": "hidden", "resmlp": "hidden", "cnn": "width", "gru": "hidden", "lstm": "hidden",
              "transformer": "d_model"}


@dataclass(frozen=True)
class Spec:
    """Everything drawn for one task; the task is a function of it."""

    seed: int
    index: int
    data: str
    model: str
    optimizer: str
    schedule: str
    mistakes: tuple[tuple[str, str], ...]  # (kind, its size in words)
    label_noise: float
    n_train: int
    n_val: int
    n_test: int
    data_args: tuple[tuple[str, Any], ...]
    depth: int
    init_std: float | None  # a plateau start: every weight drawn with this std, tanh activations
    params: tuple[tuple[str, Any], ...]  # the defaults, mistakes included
    epochs: int
    est_s: float
    capped: str = ""
    shape: tuple[int, ...] = field(default=())
    classes: int = 2


# -- data ---------------------------------------------------------------------------------------
@cache
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def _sequences(n: int, seed: int, *, vocab: int, length: int, motifs: int, motif_len: int) -> tuple[np.ndarray, ...]:
    """Token sequences; label c > 0 when motif c occurs (the first motif found), 0 when none does."""
    rng = np.random.default_rng(seed)
    pats = [rng.integers(0, vocab, motif_len) for _ in range(motifs)]
    x = rng.integers(0, vocab, size=(n, length))
    planted = rng.integers(0, motifs + 1, n)
    for i in np.nonzero(planted)[0]:
        at = rng.integers(0, length - motif_len + 1)
        x[i, at:at + motif_len] = pats[planted[i] - 1]
    windows = np.lib.stride_tricks.sliding_window_view(x, motif_len, axis=1)
    y = np.zeros(n, dtype=np.int64)
    for c in range(motifs, 0, -1):  # the lowest-numbered motif present wins
        y[(windows == pats[c - 1]).all(-1).any(-1)] = c
    return x.astype(np.int64), y


def _images(n: int, seed: int, *, size: int, classes: int, noise: float) -> tuple[np.ndarray, ...]:
    """Shapes at random places in Gaussian noise: bars (horizontal, vertical, two diagonals), a
    square outline, a cross; one channel, ``size`` x ``size``."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.normal(0, noise, (n, 1, size, size)).astype(np.float32)
    for i in range(n):
        k = int(rng.integers(size // 3, size // 2 + 1))
        r, c = (int(v) for v in rng.integers(0, size - k + 1, 2))
        img, amp = x[i, 0], float(rng.uniform(0.8, 1.5))
        idx = np.arange(k)
        if y[i] == 0:
            img[r + k // 2, c:c + k] += amp
        elif y[i] == 1:
            img[r:r + k, c + k // 2] += amp
        elif y[i] == 2:
            img[r + idx, c + idx] += amp
        elif y[i] == 3:
            img[r + idx, c + k - 1 - idx] += amp
        elif y[i] == 4:
            img[r, c:c + k] += amp
            img[r + k - 1, c:c + k] += amp
            img[r:r + k, c] += amp
            img[r:r + k, c + k - 1] += amp
        else:
            img[r + k // 2, c:c + k] += amp
            img[r:r + k, c + k // 2] += amp
    return x, y.astype(np.int64)


@cache
def _tensors_of(spec: Spec) -> Split:
    args = dict(spec.data_args)
    n = spec.n_train + spec.n_val + spec.n_test
    split_seed = 1000 * spec.seed + spec.index
    if spec.data.startswith("digits"):
        x, y = _digits_raw()
        side = int(spec.data.removeprefix("digits"))
        if spec.model == "cnn" or side > 8:
            t = torch.from_numpy(x).reshape(-1, 1, 8, 8)
            if side > 8:
                t = nn.functional.interpolate(t, size=(side, side), mode="bilinear", align_corners=False)
            x = t.contiguous().numpy()
    elif spec.data in ("wine", "cancer"):
        from sklearn.datasets import load_breast_cancer, load_wine

        x, y = (load_wine if spec.data == "wine" else load_breast_cancer)(return_X_y=True)
        x, y = x.astype(np.float32), y.astype(np.int64)
    elif spec.data == "table":
        from sklearn.datasets import make_classification

        x, y = make_classification(n_samples=n, random_state=split_seed, **args)
        x, y = x.astype(np.float32), y.astype(np.int64)
    elif spec.data == "sequences":
        x, y = _sequences(n, split_seed, **args)
    else:
        x, y = _images(n, split_seed, **args)
    x_tr, y_tr, x_va, y_va, x_te, y_te = _split(x, y, n_train=spec.n_train, n_val=spec.n_val, seed=split_seed)
    if spec.data in ("wine", "cancer", "table"):  # standardised on the training samples
        mean, std = x_tr.mean(0), x_tr.std(0) + 1e-6
        x_tr, x_va, x_te = (x_tr - mean) / std, (x_va - mean) / std, (x_te - mean) / std
    if spec.label_noise > 0:  # symmetric noise on the training labels only
        g = torch.Generator().manual_seed(split_seed)
        flip = torch.rand(len(y_tr), generator=g) < spec.label_noise
        y_tr = torch.where(flip, torch.randint(0, spec.classes, (len(y_tr),), generator=g), y_tr)
    return x_tr, y_tr, x_va, y_va, x_te, y_te


# -- models -------------------------------------------------------------------------------------
def _plateau(model: nn.Module, std: float | None) -> nn.Module:
    if std is not None:
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.normal_(m.weight, std=std)
                nn.init.zeros_(m.bias)
    return model


def _act(spec: Spec) -> nn.Module:
    return nn.Tanh() if spec.init_std is not None else nn.ReLU()


class _ResMLP(nn.Module):
    def __init__(self, n_in: int, hidden: int, n_out: int, depth: int, dropout: float) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Flatten(), nn.Linear(n_in, hidden))
        self.blocks = nn.ModuleList(nn.Sequential(nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                                  nn.Dropout(dropout)) for _ in range(depth))
        self.head = nn.Sequential(nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)  # type: ignore[no-any-return]


class _RNN(nn.Module):
    """Embedding, a GRU or an LSTM, its last hidden state to a linear head."""

    def __init__(self, kind: str, vocab: int, hidden: int, n_out: int, depth: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.rnn = (nn.GRU if kind == "gru" else nn.LSTM)(hidden, hidden, num_layers=depth, batch_first=True,
                                                         dropout=dropout if depth > 1 else 0.0)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, state = self.rnn(self.embed(x))
        h = state[0] if isinstance(state, tuple) else state  # an LSTM's (h, c)
        return self.head(self.drop(h[-1]))  # type: ignore[no-any-return]


class _Transformer(nn.Module):
    def __init__(self, vocab: int, length: int, d_model: int, n_out: int, depth: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(1, length, d_model) * 0.02)
        block = nn.TransformerEncoderLayer(d_model, 4, 2 * d_model, dropout=dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(block, depth, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x) + self.pos).mean(dim=1))  # type: ignore[no-any-return]


def _build(spec: Spec, params: dict[str, Any]) -> nn.Module:
    width = int(params.get(_WIDTH_KEY[spec.model], dict(spec.params)[_WIDTH_KEY[spec.model]]))
    p = float(params.get("dropout", 0.0))
    n_in, k = int(np.prod(spec.shape)), spec.classes
    if spec.model == "mlp":
        layers: list[nn.Module] = [nn.Flatten()]
        for i in range(spec.depth):
            layers += [nn.Linear(n_in if i == 0 else width, width), _act(spec), nn.Dropout(p)]
        return _plateau(nn.Sequential(*layers, nn.Linear(width, k)), spec.init_std)
    if spec.model == "resmlp":
        return _ResMLP(n_in, width, k, spec.depth, p)
    if spec.model == "cnn":
        side = spec.shape[-1]
        body: list[nn.Module] = []
        c_in = spec.shape[0]
        for i in range(spec.depth):
            body += [nn.Conv2d(c_in, width * 2 ** i, 3, padding=1), _act(spec), nn.MaxPool2d(2)]
            c_in, side = width * 2 ** i, side // 2
        return _plateau(nn.Sequential(*body, nn.Flatten(), nn.Dropout(p), nn.Linear(c_in * side * side, k)),
                        spec.init_std)
    vocab = int(dict(spec.data_args)["vocab"])
    if spec.model in ("gru", "lstm"):
        return _RNN(spec.model, vocab, width, k, spec.depth, p)
    d_model = max(8, 4 * round(width / 4))  # four heads divide it
    return _Transformer(vocab, spec.shape[0], d_model, k, spec.depth, p)


class _NoSingles(TensorBatches):
    """Training batches without a last, partial batch of one sample (BatchNorm cannot train on
    it), as a user's ``drop_last`` would have it; batches of one are kept where they are the size."""

    def __len__(self) -> int:
        if self.batch_size == 1:
            return int(self.x.shape[0])
        return self.x.shape[0] // self.batch_size + (self.x.shape[0] % self.batch_size > 1)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in super().__iter__():
            if len(y) > 1 or self.batch_size == 1:
                yield x, y


# -- the task -----------------------------------------------------------------------------------
class GeneratedTask(_Split3):
    """One drawn task: data, model, the user's optimizer and schedule (or the fit loop's), and
    defaults with the drawn mistakes in them."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.name = f"gen-{spec.seed}-{spec.index}"  # type: ignore[misc]
        self.default_params = dict(spec.params)  # type: ignore[misc]
        self.default_epochs = spec.epochs  # type: ignore[misc]
        self.description = describe(spec)  # type: ignore[misc]

    def _tensors(self) -> Split:
        return _tensors_of(self.spec)

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        x, y, *_ = self._tensors()
        return _NoSingles(x, y, batch_size, shuffle=True)

    def resplit(self, index: int) -> proftune.Task | None:
        if self.spec.label_noise > 0:
            return None  # noisy training labels, clean validation: a partition would mix them
        return super().resplit(index)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return _build(self.spec, params)

    def configure_optimizer(self, model: nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        """The user's own optimizer where one was drawn (it reads lr and weight_decay, nothing else)."""
        kind = self.spec.optimizer
        if kind == "fit":
            return super().configure_optimizer(model, params)
        lr, wd = float(params["lr"]), float(params.get("weight_decay", 0.0))
        if kind.startswith("sgd"):
            return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=wd)
        if kind == "adam-l2":
            return torch.optim.Adam(model.parameters(), lr=lr, weight_decay=wd)
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)

    def configure_scheduler(self, optimizer: torch.optim.Optimizer, params: dict[str, Any], *,
                            epochs: int | None, max_steps: int | None) -> Any:
        """The user's schedule, planned over the run's steps: cosine to zero, or x0.1 at each third."""
        if self.spec.schedule == "none":
            return None
        per_epoch = math.ceil(len(self._tensors()[0]) / int(params["batch_size"]))
        if epochs is None and max_steps is None:  # the run's length unsaid: the task's own protocol
            epochs = self.default_epochs
        total = min(s for s in (epochs * per_epoch if epochs else None, max_steps) if s is not None)
        if self.spec.schedule == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total))
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=max(1, total // 3), gamma=0.1)


def describe(spec: Spec) -> str:
    """What was drawn, in one line a person reads."""
    args = dict(spec.data_args)
    data = {"digits8": "sklearn digits 8x8", "digits16": "sklearn digits upsampled to 16x16",
            "digits32": "sklearn digits upsampled to 32x32", "wine": "sklearn wine", "cancer": "sklearn breast cancer",
            "table": (f"generated table ({args.get('n_features')} features, {spec.classes} classes, class_sep "
                      f"{args.get('class_sep')})"),
            "sequences": (f"motif sequences (length {args.get('length')}, vocab {args.get('vocab')}, "
                          f"{args.get('motifs')} motif(s) of {args.get('motif_len')})"),
            "images": f"generated shape images ({args.get('size')}x{args.get('size')}, {spec.classes} classes, noise "
                      f"{args.get('noise')})"}[spec.data]
    p = dict(spec.params)
    width = _WIDTH_KEY[spec.model]
    model = f"{spec.model} (depth {spec.depth}, {width} {p[width]}{', plateau start' if spec.init_std else ''})"
    opt = {"fit": f"fit loop's {p.get('optimizer', 'adamw')}", "sgd-cosine": "own SGD m0.9 + cosine",
           "sgd-step": "own SGD m0.9 + step schedule", "adam-l2": "own Adam with coupled L2",
           "adamw": "own AdamW" + (" + cosine" if spec.schedule == "cosine" else "")}[spec.optimizer]
    mistakes = ", ".join(f"{k} {size}" for k, size in spec.mistakes)
    noise = f", {spec.label_noise:.0%} label noise" if spec.label_noise else ""
    return (f"{data}, {spec.n_train}/{spec.n_val}/{spec.n_test} train/val/test{noise}; {model}; {opt}; "
            f"defaults lr {p['lr']:.3g} batch {p['batch_size']} wd {p.get('weight_decay', 0):.2g} dropout "
            f"{p.get('dropout', 0):.2g}, {spec.epochs} epochs; mistakes: {mistakes}; est. {spec.est_s:.1f} s"
            f"{f' (capped: {spec.capped})' if spec.capped else ''}")


# -- the draw -----------------------------------------------------------------------------------
def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _data_shape(rng: random.Random, data: str, model: str) -> tuple[dict[str, Any], tuple[int, ...], int, int]:
    """The data's drawn arguments, one sample's shape, its classes and how many samples it has (0:
    as many as drawn)."""
    if data.startswith("digits"):
        side = int(data.removeprefix("digits"))
        shape = (1, side, side) if model == "cnn" or side > 8 else (64,)
        return {}, shape, 10, 1797
    if data == "wine":
        return {}, (13,), 3, 178
    if data == "cancer":
        return {}, (30,), 2, 569
    if data == "table":
        classes = rng.randint(2, 7)
        feats = rng.randint(12, 54)
        inf = rng.randint(max(3, classes), min(16, feats - 2))
        args = {"n_features": feats, "n_informative": inf, "n_redundant": rng.randint(0, feats - inf),
                "n_classes": classes, "n_clusters_per_class": rng.randint(1, 3),
                "class_sep": round(rng.uniform(0.6, 1.6), 2), "flip_y": 0.01}
        while classes * args["n_clusters_per_class"] > 2 ** inf:
            args["n_clusters_per_class"] -= 1
        return args, (feats,), classes, 0
    if data == "sequences":
        motifs, length = rng.randint(1, 3), rng.randint(12, 40)
        args = {"vocab": rng.randint(6, 16), "length": length, "motifs": motifs, "motif_len": rng.randint(3, 4)}
        return args, (length,), motifs + 1, 0
    size, classes = rng.choice((12, 16, 24)), rng.randint(3, 6)
    args = {"size": size, "classes": classes, "noise": round(rng.uniform(0.3, 0.9), 2)}
    return args, ((1, size, size) if model == "cnn" else (size * size,)), classes, 0


def _macs(spec: Spec, params: dict[str, Any]) -> float:
    """Multiply-accumulates of one sample's forward pass (the cost model's only input from the model)."""
    w = int(params[_WIDTH_KEY[spec.model]])
    n_in = int(np.prod(spec.shape))
    if spec.model == "mlp":
        return n_in * w + (spec.depth - 1) * w * w + w * spec.classes
    if spec.model == "resmlp":
        return n_in * w + spec.depth * w * w + w * spec.classes
    if spec.model == "cnn":
        side, c_in, total = spec.shape[-1], spec.shape[0], 0.0
        for i in range(spec.depth):
            total += side * side * c_in * w * 2 ** i * 9
            c_in, side = w * 2 ** i, side // 2
        return total + c_in * side * side * spec.classes
    length = spec.shape[0]
    if spec.model in ("gru", "lstm"):
        return length * spec.depth * (3 if spec.model == "gru" else 4) * 2 * w * w
    return length * spec.depth * (4 * w * w + 4 * w * w) + spec.depth * length * length * w


def _estimate_s(spec: Spec) -> float:
    """Seconds of one training of the defaults on one CPU thread of a busy 2-core machine, through
    proftune's fit loop: a per-step overhead by model kind (a recurrent net's per token), the
    forward and backward MACs at ~2 GMAC/s (a recurrent net's matmuls at 4x that), and one pass over
    validation an epoch. Fixed numbers (measured once, rounded up): the draw is machine-free."""
    p = dict(spec.params)
    bs = max(1, min(int(p["batch_size"]), spec.n_train))
    steps = math.ceil(spec.n_train / bs)
    step_ms = {"mlp": 1.5, "resmlp": 2.0, "cnn": 2.5, "gru": 1.5, "lstm": 1.5, "transformer": 3.0}[spec.model]
    rate = 2e9
    if spec.model in ("gru", "lstm"):
        step_ms += 0.12 * spec.shape[0] * spec.depth
        rate *= 4
    macs = _macs(spec, p)
    train_s = steps * (step_ms / 1e3 + 3 * macs * bs / rate)
    val_s = math.ceil(spec.n_val / bs) * step_ms / 3e3 + macs * spec.n_val / rate
    return spec.epochs * (train_s + val_s)


def _base(rng: random.Random, model: str, optimizer: str, n_train: int) -> dict[str, Any]:
    """A sane configuration for the drawn kinds, jittered; the mistakes are applied to it."""
    jitter = _log_uniform(rng, 0.5, 2.0)
    if optimizer.startswith("sgd"):
        lr = 0.05 * jitter
    else:
        lr = {"transformer": 5e-4, "gru": 3e-3, "lstm": 3e-3}.get(model, 1e-3) * jitter
    width = {"mlp": rng.choice((64, 128, 256)), "resmlp": rng.choice((64, 128)), "cnn": rng.choice((8, 16)),
             "gru": rng.choice((32, 64)), "lstm": rng.choice((32, 64)), "transformer": rng.choice((32, 48, 64))}[model]
    batch = rng.choice((16, 32, 64, 128))
    while batch > 16 and n_train / batch < 8:
        batch //= 2
    params: dict[str, Any] = {"lr": float(f"{lr:.3g}"), "batch_size": batch, _WIDTH_KEY[model]: width,
                              "dropout": rng.choice((0.0, 0.1, 0.2))}
    if optimizer == "fit":
        params["optimizer"] = rng.choice(("adamw", "adamw", "sgd"))
        if params["optimizer"] == "sgd":
            params["momentum"] = 0.9
            params["lr"] = float(f"{0.05 * jitter:.3g}")
    else:
        params["weight_decay"] = {"adamw": 1e-2, "adam-l2": 1e-5}.get(optimizer, 5e-4)
    return params


def _apply(rng: random.Random, kind: str, params: dict[str, Any], epochs: int, n_train: int,
           optimizer: str) -> tuple[int, float | None, str]:
    """Put mistake ``kind`` into ``params`` (in place); the epochs, a plateau's init std and the
    mistake's size in words."""
    init_std: float | None = None
    if kind in ("lr-high", "lr-low"):
        f = _log_uniform(rng, 3.0, 100.0)
        params["lr"] = float(f"{params['lr'] * (f if kind == 'lr-high' else 1 / f):.3g}")
        return epochs, None, f"x{f:.0f}" if kind == "lr-high" else f"x1/{f:.0f}"
    if kind == "batch-big":
        if rng.random() < 0.3:
            params["batch_size"] = 2 ** math.ceil(math.log2(n_train)) * 2
            return epochs, None, f"{params['batch_size']} (beyond the {n_train} samples)"
        f = rng.choice((4, 8))
        params["batch_size"] *= f
        return epochs, None, f"x{f} ({params['batch_size']})"
    if kind == "batch-small":
        f = rng.choice((4, 8))
        params["batch_size"] = max(2, params["batch_size"] // f)
        return epochs, None, f"x1/{f} ({params['batch_size']})"
    if kind == "over-reg":
        params["dropout"] = rng.choice((0.5, 0.6, 0.7))
        named = params.get("optimizer", optimizer)
        wd = {"adam-l2": 5e-2, "adamw": 0.3}.get(named, 1e-2) * _log_uniform(rng, 0.5, 2.0)
        params["weight_decay"] = float(f"{wd:.2g}")
        return epochs, None, f"dropout {params['dropout']}, wd {params['weight_decay']:.2g}"
    if kind == "under-reg":
        params["dropout"] = 0.0
        params["weight_decay"] = 0.0
        key = next(k for k in ("hidden", "width", "d_model") if k in params)
        params[key] *= 2
        return epochs, None, f"dropout 0, wd 0, {key} x2 ({params[key]})"
    if kind == "few-epochs":
        f = rng.randint(3, 10)
        return max(1, epochs // f), None, f"x1/{f}"
    init_std = 10 ** rng.uniform(-3, -2)
    return epochs, init_std, f"init std {init_std:.1g}"


def draw(seed: int, index: int, *, max_training_s: float | None = None) -> Spec:
    """The ``index``-th task of ``seed``: a function of the two alone (and of the cap, at most
    ``SPACE_MAX_S``)."""
    rng = random.Random(f"proftune-generated-{seed}-{index}")
    data = rng.choice(DATA_KINDS)
    model = rng.choice(_MODELS_FOR[data])
    args, shape, classes, have = _data_shape(rng, data, model)
    n_val = rng.choice((100, 200, 300)) if have != 178 else 40
    n_test = {1797: 500, 178: 48, 569: 149}.get(have, 2000)
    n_train = min((have - n_val - n_test) if have else 5000, round(_log_uniform(rng, 50, 5000)))
    if have:  # a fixed data set's samples that train on nothing are tested on
        n_test = have - n_val - n_train
    optimizer = rng.choice(OPTIMIZER_KINDS)
    schedule = {"sgd-cosine": "cosine", "sgd-step": "step",
                "adamw": rng.choice(("none", "cosine"))}.get(optimizer, "none")
    params = _base(rng, model, optimizer, n_train)
    steps_wanted = rng.choice((300, 600, 1200))
    epochs = max(3, min(60, round(steps_wanted * params["batch_size"] / n_train)))
    kinds = [k for k in MISTAKE_KINDS if k != "plateau" or model in ("mlp", "cnn")]
    first = rng.choice(kinds)
    picked = [first]
    if rng.random() < 0.4:
        picked.append(rng.choice([k for k in kinds if k != first and {first, k} not in _CONFLICTS]))
    label_noise = rng.choice((0.0, 0.0, 0.0, 0.1, 0.2, 0.3))
    if "under-reg" in picked:
        label_noise = max(label_noise, rng.choice((0.2, 0.3, 0.4)))
    mistakes, init_std = [], None
    for kind in picked:
        epochs, std, size = _apply(rng, kind, params, epochs, n_train, optimizer)
        init_std = std if std is not None else init_std
        mistakes.append((kind, size))
    spec = Spec(seed=seed, index=index, data=data, model=model, optimizer=optimizer, schedule=schedule,
                mistakes=tuple(mistakes), label_noise=label_noise, n_train=n_train, n_val=n_val, n_test=n_test,
                data_args=tuple(sorted(args.items())), depth=rng.randint(1, 2) if model != "mlp" else rng.randint(2, 3),
                init_std=init_std, params=tuple(sorted(params.items())), epochs=epochs, est_s=0.0,
                shape=shape, classes=classes)
    spec = replace(spec, est_s=_estimate_s(spec))
    return _cap(spec, min(max_training_s or SPACE_MAX_S, SPACE_MAX_S))


def _cap(spec: Spec, max_s: float) -> Spec:
    """``spec`` at most ``max_s`` estimated seconds (where 50 samples and one epoch are): the
    training samples and the epochs each cut by the square root of the excess (the samples down to
    50, the epochs to 1), then the epochs, then the samples for what is left."""
    if spec.est_s <= max_s:
        return spec
    was = f"{spec.n_train} samples x {spec.epochs} epochs, est. {spec.est_s:.1f} s"
    root = math.sqrt(max_s / spec.est_s)
    out = replace(spec, n_train=max(50, min(spec.n_train, int(spec.n_train * root))))
    out = replace(out, epochs=max(1, int(out.epochs * root)))
    out = replace(out, est_s=_estimate_s(out))
    if out.est_s > max_s:
        out = replace(out, epochs=max(1, int(out.epochs * max_s / out.est_s)))
        out = replace(out, est_s=_estimate_s(out))
    if out.est_s > max_s:  # one epoch is still too long: fewer samples again
        out = replace(out, n_train=max(50, int(out.n_train * max_s / out.est_s)))
        out = replace(out, est_s=_estimate_s(out))
    if out.n_train != spec.n_train and (spec.data in ("wine", "cancer") or spec.data.startswith("digits")):
        out = replace(out, n_test=spec.n_test + spec.n_train - out.n_train)  # the rest is tested on
    return replace(out, capped=f"was {was}")


def draw_tasks(seed: int, n: int, *, max_training_s: float | None = None) -> list[GeneratedTask]:
    """``n`` tasks drawn with ``seed``; each a :class:`proftune.Task` with ``test_data``."""
    return [GeneratedTask(draw(seed, i, max_training_s=max_training_s)) for i in range(n)]

