"""Loading scikit-learn's bundled datasets with a fixed, seeded, stratified split."""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

SPLIT_SEED = 0
VAL_FRACTION = 0.2


@cache
def load_split(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_train, y_train, x_val, y_val)`` of a bundled dataset, features standardised on train."""
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    loaders = {
        "digits": datasets.load_digits,
        "wine": datasets.load_wine,
        "breast_cancer": datasets.load_breast_cancer,
    }
    if name not in loaders:
        raise ValueError(f"unknown dataset {name=}; valid: {', '.join(loaders)}.")
    bunch = loaders[name]()
    x = np.asarray(bunch.data, dtype=np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    x_tr, x_va, y_tr, y_va = train_test_split(
        x, y, test_size=VAL_FRACTION, random_state=SPLIT_SEED, stratify=y
    )
    if name == "digits":
        # pixel intensities are 0..16; one scale for every pixel keeps the image intact
        x_tr, x_va = x_tr / 16.0, x_va / 16.0
    else:
        mean, std = x_tr.mean(axis=0), x_tr.std(axis=0) + 1e-8
        x_tr, x_va = (x_tr - mean) / std, (x_va - mean) / std
    return (
        torch.from_numpy(np.ascontiguousarray(x_tr)),
        torch.from_numpy(y_tr),
        torch.from_numpy(np.ascontiguousarray(x_va)),
        torch.from_numpy(y_va),
    )
