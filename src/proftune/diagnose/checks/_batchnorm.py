"""Batch norm over small batches: noisy batch statistics that differ from the running ones."""

from __future__ import annotations

import statistics

from .._findings import Finding
from .._history import History
from ._base import BaseCheck


class BatchNormSmallBatch(BaseCheck):
    cause = "batchnorm_small_batch"
    explains = (
        "lr_too_high",
        "overfitting",
        "exploding_gradients",
        "oscillating_loss",
        "no_lr_decay",
        "dead_units",
    )

    def check(self, history: History) -> Finding | None:
        if not history.batchnorm or not history.batch_sizes:
            return None
        bs = statistics.median(history.batch_sizes)
        if bs >= 16:
            return None
        severity = "warning" if bs <= 8 else "info"
        evidence: dict[str, object] = {"batch_size": bs, "batchnorm_layers": history.batchnorm}
        if history.epochs:
            e = history.epochs[-1]
            if "train_loss" in e and "val_loss" in e:
                evidence["train_loss"], evidence["val_loss_eval_mode"] = e["train_loss"], e["val_loss"]
        summary = (f"{len(history.batchnorm)} batch-norm layer(s) normalise over batches of {bs:g} samples: "
                   "the batch statistics are noisy and differ from the running ones used at eval")
        fix = ("use a batch of 16 or more (grad accumulation does not help batch norm), or GroupNorm/LayerNorm, "
               "or freeze batch-norm statistics")
        # a configuration fact seen from step 1: at 8 samples or fewer it is a root cause of the
        # noise it brings (a noisy loss, gradient spikes, a range test that blames the rate)
        return Finding(self.cause, severity, summary, fix, evidence,
                       0.7 if severity == "warning" else 0.3, step=1, layer=history.batchnorm[0],
                       root=severity == "warning")
