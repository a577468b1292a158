"""Device resolution and moving batches to a device (one place for both)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from .exceptions import ConfigError

VALID_DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """Turn ``auto|cpu|cuda|cuda:N`` into a torch.device that exists on this machine."""
    if isinstance(device, torch.device):
        spec = str(device)
    else:
        spec = (device or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device={spec!r} was asked for but CUDA is not available on this machine; "
                "valid choices here: cpu, auto."
            )
        dev = torch.device(spec)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device={spec!r} does not exist: this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)."
            )
        return dev
    raise ConfigError(f"device={spec!r} is not a device; valid choices: {', '.join(VALID_DEVICES)}.")


def move_to_device(batch: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """Move tensors inside tuples, lists and dicts to ``device``; leave anything else as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, tuple):
        moved = [move_to_device(b, device, non_blocking=non_blocking) for b in batch]
        if hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*moved)
        return tuple(moved)
    if isinstance(batch, list):
        return [move_to_device(b, device, non_blocking=non_blocking) for b in batch]
    if isinstance(batch, dict):
        return {k: move_to_device(v, device, non_blocking=non_blocking) for k, v in batch.items()}
    return batch


class DeviceIterable:
    """Wraps an iterable of batches so that each batch arrives on ``device``."""

    def __init__(self, data: Iterable[Any], device: torch.device) -> None:
        self.data = data
        self.device = device

    def __iter__(self) -> Iterator[Any]:
        for batch in self.data:
            yield move_to_device(batch, self.device)

    def __len__(self) -> int:
        return len(self.data)  # type: ignore[arg-type]


def batch_size_of(batch: Any) -> int:
    """Number of samples in a batch: the leading dimension of its first tensor (1 if none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, (tuple, list)):
        for b in batch:
            n = batch_size_of(b)
            if n:
                return n
        return 1
    if isinstance(batch, dict):
        for v in batch.values():
            return batch_size_of(v)
    return 1


def take_rows(batch: Any, index: torch.Tensor, n: int) -> Any:
    """Rows ``index`` of every tensor in ``batch`` whose leading dimension is ``n`` (the batch's
    samples); other leaves are kept as they are. Tuples, lists, namedtuples and dicts recurse."""
    if isinstance(batch, torch.Tensor):
        return batch[index.to(batch.device)] if batch.dim() > 0 and batch.shape[0] == n else batch
    if isinstance(batch, tuple):
        rows = [take_rows(b, index, n) for b in batch]
        return type(batch)(*rows) if hasattr(batch, "_fields") else tuple(rows)
    if isinstance(batch, list):
        return [take_rows(b, index, n) for b in batch]
    if isinstance(batch, dict):
        return {k: take_rows(v, index, n) for k, v in batch.items()}
    return batch


def has_rows(batch: Any, n: int) -> bool:
    """Whether ``batch`` holds a tensor with ``n`` rows that :func:`take_rows` can split."""
    if isinstance(batch, torch.Tensor):
        return batch.dim() > 0 and batch.shape[0] == n
    if isinstance(batch, (tuple, list)):
        return any(has_rows(b, n) for b in batch)
    if isinstance(batch, dict):
        return any(has_rows(v, n) for v in batch.values())
    return False


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on ``device`` so that host timers measure them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def call_model(model: torch.nn.Module, example_input: Any) -> Any:
    """``model(x)``, ``model(*args)`` for a tuple or list, ``model(**kwargs)`` for a dict."""
    if isinstance(example_input, dict):
        return model(**example_input)
    if isinstance(example_input, (tuple, list)):
        return model(*example_input)
    return model(example_input)


def clock(device: torch.device | None = None) -> float:
    """``time.perf_counter()`` after the queued kernels of ``device`` finished (seconds).

    The one synchronized clock: host timers around CUDA work read this, so a kernel still in
    flight is not missed; on CPU it costs nothing but the call.
    """
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def output_loss(output: Any) -> torch.Tensor | None:
    """The loss a model computed itself: ``.loss`` of a Hugging Face ``ModelOutput``, or a dict's
    ``"loss"``; None when the output carries none."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


def capture_inputs(loss_fn: Any, model: nn.Module, batch: Any) -> Any:
    """The inputs the task's loss feeds ``model`` for ``batch``: a tensor, a tuple or a dict."""
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def pre(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not seen:
            seen.append((args, kwargs))

    handle = model.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with torch.no_grad():
            loss_fn(model, batch)
    finally:
        handle.remove()
    if not seen:
        raise ConfigError("the task's loss never called the model, so there are no model(...) inputs to time or trace.")
    args, kwargs = seen[0]
    if kwargs and not args:
        return dict(kwargs)
    return args[0] if len(args) == 1 else tuple(args)


def slice_batch(example: Any, n: int) -> Any:
    """The first ``n`` rows of every tensor in ``example``."""
    if isinstance(example, torch.Tensor):
        return example[:n]
    if isinstance(example, (tuple, list)):
        return type(example)(slice_batch(e, n) for e in example)
    if isinstance(example, dict):
        return {k: slice_batch(v, n) for k, v in example.items()}
    return example
