"""The training data is not shuffled: consecutive samples share labels far more than by chance."""

from __future__ import annotations

from .._findings import Finding
from .._history import History
from ._base import BaseCheck


class Unshuffled(BaseCheck):
    cause = "unshuffled_data"
    explains = (
        "lr_too_high",
        "exploding_gradients",
        "dead_units",
        "lr_too_low",
        "overfitting",
        "nan_inf",
        "oscillating_loss",
        "slow_convergence",
        "no_lr_decay",
        "no_warmup",
    )

    def check(self, history: History) -> Finding | None:
        order = history.label_order()
        if order is None or (order.excess < 0.3 and order.diversity > 0.7):
            return None
        strong = order.excess > 0.6 or order.diversity < 0.4
        evidence = {k: v for k, v in order.to_dict().items() if k not in ("excess", "diversity", "batch_size")}
        summary = (f"consecutive samples share a label {order.adjacent_same_label:.0%} of the time "
                   f"(shuffled: {order.expected_if_shuffled:.0%}); batches hold "
                   f"{order.labels_per_batch:.1f} distinct labels "
                   f"(shuffled: {order.expected_labels_per_batch:.1f})")
        fix = "shuffle the training data every epoch (DataLoader(shuffle=True) or a sampler)"
        return Finding(self.cause, "error" if strong else "warning", summary, fix, evidence,
                       0.95 if strong else 0.7, step=1, root=strong)
