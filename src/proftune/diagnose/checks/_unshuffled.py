"""The training data is not shuffled: consecutive samples share labels far more than by chance."""

from __future__ import annotations

import statistics

import torch

from .._findings import Finding
from .._history import History
from ._base import BaseCheck


class Unshuffled(BaseCheck):
    cause = "unshuffled_data"

    def check(self, history: History) -> Finding | None:
        if len(history.labels) < 4:
            return None
        seq = torch.cat(history.labels)
        classes, counts = torch.unique(seq, return_counts=True)
        if classes.numel() < 2:
            return None
        p = counts.double() / counts.sum()
        expected_same = float((p**2).sum())
        same = float((seq[1:] == seq[:-1]).double().mean())
        per_batch = [int(torch.unique(y).numel()) for y in history.labels]
        bs = statistics.median(int(y.numel()) for y in history.labels)
        expected_unique = float((1 - (1 - p) ** bs).sum())
        unique = statistics.fmean(per_batch)
        ys = seq.double()
        autocorr = float(torch.corrcoef(torch.stack([ys[1:], ys[:-1]]))[0, 1]) if ys.std() > 0 else 0.0
        excess = (same - expected_same) / max(1 - expected_same, 1e-9)
        diversity = unique / max(expected_unique, 1e-9)
        if excess < 0.3 and diversity > 0.7:
            return None
        strong = excess > 0.6 or diversity < 0.4
        evidence = {"adjacent_same_label": same, "expected_if_shuffled": expected_same,
                    "label_autocorrelation": autocorr, "labels_per_batch": unique,
                    "expected_labels_per_batch": expected_unique, "batches_seen": len(history.labels),
                    "classes": int(classes.numel())}
        summary = (f"consecutive samples share a label {same:.0%} of the time (shuffled: {expected_same:.0%}); "
                   f"batches hold {unique:.1f} distinct labels (shuffled: {expected_unique:.1f})")
        fix = "shuffle the training data every epoch (DataLoader(shuffle=True) or a sampler)"
        return Finding(self.cause, "error" if strong else "warning", summary, fix, evidence,
                       0.95 if strong else 0.7, step=1, root=strong)
