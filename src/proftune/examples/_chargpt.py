"""A built-in character-level GPT with nanoGPT's CPU shape, trained on the Python standard library's
own source files (text every Python installation has, no download).

The shape and the training are those of nanoGPT's README for a laptop CPU (``train_shakespeare_char``
with ``--n_layer=4 --n_head=4 --n_embd=128 --block_size=64 --batch_size=12 --max_iters=2000
--lr_decay_iters=2000 --dropout=0.0``): a pre-norm causal transformer without biases, tied input
and output embeddings, AdamW (betas 0.9/0.99, weight decay 0.1 on the matrices only, gradients
clipped to 1.0) at lr 1e-3 with 100 steps of linear warm-up and a cosine decay to lr/10 over the
run. There it reaches a validation loss of about 1.88 on Shakespeare in about 3 minutes.

The corpus: ``.py`` files under ``sysconfig.get_paths()['stdlib']`` (no tests, no site-packages,
none over 200 kB), taken in the order of a hash of their relative paths until ``byte_budget``
bytes, each file wholly in one split by that hash, each split filled to its share of the budget
(80% train, 10% validation, 10% test), so the splits are disjoint by file and the same on every
run of the same Python. A character is a byte (vocabulary 256). :func:`corpus` gives the splits
and their fingerprint.

The protocol: an epoch is ``samples_per_epoch`` random windows of ``block_size + 1`` bytes of the
training split (2400: 200 steps at batch 12), so the defaults' 10 epochs are nanoGPT's 2000 steps
and a batch size changes the steps, not the data, of an epoch. The schedule spans the run the fit
loop is asked for (its epochs, or ``max_steps``); its warm-up, in steps of the task's own 10
epochs, is the same share of a shorter run. Validation and test are fixed, evenly spaced
windows of their splits. Metrics: ``val_loss`` (nats per byte), ``perplexity``, ``bits_per_char``.

Measured on 2 shared CPU cores (torch 2.14, 2 threads), the defaults: seeds 0 and 1 reach val loss
1.644 / 1.651 and test loss 1.654 / 1.650 in 303 s / 195 s (load 0.4-3.2; an unloaded epoch
takes 8-10 s, so about 100 s per training on a free machine).
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch import nn
from torch.nn import functional as F

from ..exceptions import TaskLoadError
from ..task import Task

VOCAB = 256
#: Folders of the standard library that are not its own code (or are mostly data).
_SKIP_PARTS = frozenset({"site-packages", "dist-packages", "test", "tests", "__pycache__", "idle_test"})
_MAX_FILE_BYTES = 200_000
_MIN_SPLIT_BYTES = 4096
#: Each split's share of the byte budget; a file's split is a hash of its path.
_SHARES = {"train": 0.8, "val": 0.1, "test": 0.1}


@dataclass(frozen=True)
class Corpus:
    """The three splits as byte tensors, the files of each (paths relative to ``root``), and a
    fingerprint of all of it (names and contents)."""

    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor
    files: dict[str, tuple[str, ...]]
    fingerprint: str
    root: str


def _split_of(rel: str) -> str:
    bucket = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % 10
    return "test" if bucket == 0 else "val" if bucket == 1 else "train"


@lru_cache(maxsize=4)
def corpus(byte_budget: int, root: str | None = None) -> Corpus:
    """About ``byte_budget`` bytes of the standard library's sources (``root``: that folder
    instead), split by file; a folder with no sources (an installation without them) is a
    TaskLoadError saying so."""
    folder = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in folder.rglob("*.py")
                   if not _SKIP_PARTS.intersection(p.relative_to(folder).parts[:-1])) if folder.is_dir() else []
    if not files:
        raise TaskLoadError(
            f"task 'char-gpt' trains on the Python standard library's .py sources, but {str(folder)!r} "
            "holds none (this Python ships without them, e.g. only .pyc files or a zip); install the "
            "standard library's sources (Debian/Ubuntu: the libpython3.X-stdlib package) or use another task.")
    chosen: dict[str, list[bytes]] = {"train": [], "val": [], "test": []}
    names: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    digest = hashlib.sha256()
    share = {k: byte_budget * f for k, f in _SHARES.items()}
    filled = dict.fromkeys(_SHARES, 0)
    # the hash of the relative path orders the files: a mix of the library, not its first letters
    for rel in sorted((p.relative_to(folder).as_posix() for p in files),
                      key=lambda r: hashlib.sha256(r.encode()).hexdigest()):
        split = _split_of(rel)
        if filled[split] >= share[split]:
            if all(filled[k] >= share[k] for k in share):
                break
            continue
        data = (folder / rel).read_bytes()
        if not data or len(data) > _MAX_FILE_BYTES:
            continue
        chosen[split].append(data)
        names[split].append(rel)
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        filled[split] += len(data)
    tensors = {k: torch.frombuffer(bytearray(b"".join(v)), dtype=torch.uint8).long() if v
               else torch.zeros(0, dtype=torch.long) for k, v in chosen.items()}
    short = [k for k, t in tensors.items() if t.numel() < _MIN_SPLIT_BYTES]
    if short:
        raise TaskLoadError(
            f"task 'char-gpt': {str(folder)!r} gave too little text for the {', '.join(short)} split "
            f"(under {_MIN_SPLIT_BYTES} bytes of {byte_budget=}); give a larger byte_budget.")
    return Corpus(tensors["train"], tensors["val"], tensors["test"], {k: tuple(v) for k, v in names.items()},
                  digest.hexdigest(), str(folder))


class _Windows:
    """Batches ``(x, y)`` of windows of ``tokens``: ``y`` is ``x`` shifted by one byte.

    ``random``: ``count`` windows at offsets drawn from torch's global RNG (which the fit loop
    seeds), nanoGPT's ``get_batch``; else ``count`` fixed, evenly spaced windows.
    """

    def __init__(self, tokens: torch.Tensor, *, block: int, batch_size: int, count: int, random: bool) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, but got {batch_size=}.")
        self.tokens, self.block, self.batch_size = tokens, block, int(batch_size)
        self.count, self.random = count, random

    def __len__(self) -> int:
        return (self.count + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        last = self.tokens.numel() - self.block - 1
        if self.random:
            starts = torch.randint(0, last + 1, (self.count,))
        else:
            starts = torch.linspace(0, last, self.count).long()
        offsets = torch.arange(self.block + 1)
        for i in range(0, self.count, self.batch_size):
            w = self.tokens[starts[i : i + self.batch_size, None] + offsets]
            yield w[:, :-1], w[:, 1:]


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention through ``scaled_dot_product_attention``; a width that is no
    multiple of the heads gets ``ceil(width / heads)`` columns per head inside."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, math.ceil(width / heads)
        self.qkv = nn.Linear(width, 3 * heads * self.head_dim, bias=False)
        self.proj = nn.Linear(heads * self.head_dim, width, bias=False)
        self.dropout = dropout
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return cast(torch.Tensor, self.drop(self.proj(y.transpose(1, 2).reshape(b, t, -1))))


class Block(nn.Module):
    """Pre-norm transformer block: attention, then a 4x GELU MLP, each residual."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width, bias=False)
        self.attn = CausalSelfAttention(width, heads, dropout)
        self.ln2 = nn.LayerNorm(width, bias=False)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width, bias=False), nn.GELU(),
                                 nn.Linear(4 * width, width, bias=False), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return cast(torch.Tensor, x + self.mlp(self.ln2(x)))


class CharGPT(nn.Module):
    """nanoGPT's model: token and position embeddings, ``layers`` blocks, a final norm, and the
    output head tied to the token embedding; ``forward(x)`` gives logits (B, T, 256)."""

    def __init__(self, *, width: int, layers: int, heads: int, block: int, dropout: float) -> None:
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(block, width)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[Block(width, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width, bias=False)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.head.weight = self.tok.weight
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device)
        h = self.blocks(self.drop(self.tok(x) + self.pos(pos)))
        return cast(torch.Tensor, self.head(self.ln_f(h)))


class CharGPTTask(Task):
    name = "char-gpt"
    description = ("character-level GPT (nanoGPT's CPU shape: 4 layers, 4 heads, width 128, block 64) on "
                   "~3 MB of the Python standard library's own sources; AdamW, warm-up + cosine, 2000 steps "
                   "(params: n_embd=128, warmup=100, dropout=0.0)")
    default_params: ClassVar[dict[str, Any]] = {
        "lr": 1e-3, "batch_size": 12, "optimizer": "adamw", "weight_decay": 0.1, "grad_clip": 1.0,
        "n_embd": 128, "warmup": 100, "dropout": 0.0,
    }
    default_epochs: ClassVar[int] = 10
    metric_directions: ClassVar[dict[str, str]] = {"bits_per_char": "min"}
    #: The model's fixed shape (nanoGPT's): depth, heads, context in bytes.
    n_layer: ClassVar[int] = 4
    n_head: ClassVar[int] = 4
    block_size: ClassVar[int] = 64
    #: Training windows per epoch (200 steps at the default batch of 12).
    samples_per_epoch: ClassVar[int] = 2400
    #: Fixed windows of the validation and of the test split that evaluation reads.
    eval_windows: ClassVar[int] = 480
    #: Bytes of the standard library read (all three splits).
    byte_budget: ClassVar[int] = 3_000_000
    #: The folder of sources; None: this Python's standard library.
    source_dir: ClassVar[str | None] = None
    #: The cosine decays to this fraction of ``lr`` (nanoGPT: min_lr = lr / 10).
    min_lr_ratio: ClassVar[float] = 0.1

    def corpus(self) -> Corpus:
        return corpus(self.byte_budget, self.source_dir)

    def build_model(self, params: dict[str, Any]) -> nn.Module:
        return CharGPT(width=int(params.get("n_embd", 128)), layers=self.n_layer, heads=self.n_head,
                       block=self.block_size, dropout=float(params.get("dropout", 0.0)))

    def train_data(self, batch_size: int, params: dict[str, Any]) -> Iterable[Any]:
        return _Windows(self.corpus().train, block=self.block_size, batch_size=batch_size,
                        count=self.samples_per_epoch, random=True)

    def val_data(self, batch_size: int) -> Iterable[Any]:
        return _Windows(self.corpus().val, block=self.block_size, batch_size=batch_size,
                        count=self.eval_windows, random=False)

    def test_data(self, batch_size: int) -> Iterable[Any] | None:
        return _Windows(self.corpus().test, block=self.block_size, batch_size=batch_size,
                        count=self.eval_windows, random=False)

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))

    def evaluate(self, model: nn.Module, data: Iterable[Any]) -> dict[str, float]:
        total, count = 0.0, 0
        for x, y in data:
            total += float(F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1), reduction="sum"))
            count += int(y.numel())
        loss = total / max(count, 1)
        return {"val_loss": loss, "perplexity": math.exp(min(loss, 50.0)), "bits_per_char": loss / math.log(2)}

    def configure_optimizer(self, model: nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
        """nanoGPT's AdamW: betas (0.9, 0.99), weight decay on the matrices only; another
        ``params["optimizer"]`` gets the loop's own optimizer."""
        if str(params.get("optimizer", "adamw")).lower() != "adamw":
            return super().configure_optimizer(model, params)
        trainable = [p for p in model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in trainable if p.dim() >= 2],
                   "weight_decay": float(params.get("weight_decay", 0.1))},
                  {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=float(params.get("lr", 1e-3)),
                                 betas=(0.9, 0.99))

    def steps_per_epoch(self, batch_size: int) -> int:
        return math.ceil(self.samples_per_epoch / batch_size)

    def configure_scheduler(self, optimizer: torch.optim.Optimizer, params: dict[str, Any], *,
                            epochs: int | None, max_steps: int | None) -> Any:
        """Linear warm-up, then a cosine from lr to lr * ``min_lr_ratio`` over the rest of the run
        (nanoGPT's ``get_lr``). ``params["warmup"]`` is in steps of the task's own protocol (its
        ``default_epochs``); a shorter run warms up for the same share of its steps, so that a
        short trial is not all warm-up."""
        per_epoch = self.steps_per_epoch(int(params.get("batch_size", self.default_params["batch_size"])))
        protocol = self.default_epochs * per_epoch
        planned = [n for n in (max_steps, epochs * per_epoch if epochs is not None else None) if n is not None]
        total = max(1, min(planned)) if planned else protocol
        warmup = max(0, min(round(int(params.get("warmup", 100)) * min(1.0, total / protocol)), total))
        floor = self.min_lr_ratio

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
