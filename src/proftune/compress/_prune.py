"""Pruning: unstructured magnitude masks (``torch.nn.utils.prune``) and structured, dependency-aware
channel/filter/head removal (Torch-Pruning).

Unstructured pruning zeroes weights but keeps every tensor its size: dense kernels run exactly as
fast as before. Structured pruning removes whole channels so the model is physically smaller; the
``DependencyGraph`` of Torch-Pruning keeps every layer that shares a channel consistent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .._device import call_model
from .._optional import require
from ..exceptions import ConfigError
from ..profile import LayerHooks

__all__ = [
    "IMPORTANCES",
    "PRUNE_METHODS",
    "final_classifier",
    "make_permanent",
    "prunable_layers",
    "prune_structured",
    "prune_unstructured",
    "resolve_layers",
    "sparsity",
]

PRUNE_METHODS = ("unstructured", "structured")
IMPORTANCES = ("l1", "l2", "taylor", "bn")
#: Module types whose weights are pruned (unstructured) or whose channels are cut (structured).
_PRUNABLE = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def _tp() -> Any:
    return require("torch_pruning", feature="structured pruning")


def prunable_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Conv and Linear layers by module path, in definition order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, _PRUNABLE) and name}


def final_classifier(model: nn.Module, example: Any) -> str | None:
    """The path of the last prunable layer that runs in a forward pass: its outputs are the classes."""
    order: list[str] = []
    names = {id(m): n for n, m in prunable_layers(model).items()}
    hooks = [m.register_forward_hook(lambda mod, _i, _o: order.append(names[id(mod)]))
             for m in prunable_layers(model).values()]
    try:
        with torch.no_grad():
            call_model(model, example)
    finally:
        for h in hooks:
            h.remove()
    return order[-1] if order else None


def resolve_layers(model: nn.Module, names: Sequence[str]) -> list[nn.Module]:
    """Modules named by path (``layer4.1.conv2``); one error lists every unknown name."""
    table = dict(model.named_modules())
    unknown = [n for n in names if n not in table]
    if unknown:
        valid = ", ".join(list(prunable_layers(model))[:20])
        raise ConfigError(
            f"ignore_layers= names unknown layers: {', '.join(unknown)}; layers of this model "
            f"include: {valid}."
        )
    return [table[n] for n in names]


def sparsity(model: nn.Module) -> float:
    """Fraction of zero weights over the prunable layers' weights."""
    zeros = total = 0
    for m in prunable_layers(model).values():
        w = m.get_parameter("weight").detach()
        zeros += int((w == 0).sum())
        total += w.numel()
    return zeros / total if total else 0.0


def prune_unstructured(
    model: nn.Module,
    ratio: float,
    *,
    global_pruning: bool = False,
    importance: str = "l1",
    ignored: Sequence[nn.Module] = (),
    permanent: bool = True,
) -> nn.Module:
    """Zero the ``ratio`` smallest-magnitude weights, globally or per layer.

    ``importance`` ``l1`` and ``l2`` rank weights by ``|w|`` (the same order). With
    ``permanent=False`` the masks stay (so fine-tuning cannot regrow pruned weights) until
    :func:`make_permanent` bakes them into the weights and the model is a plain module again.
    """
    from torch.nn.utils import prune

    if importance not in ("l1", "l2"):
        raise ConfigError(
            f"unstructured pruning ranks weights by magnitude; importance={importance!r} applies to "
            "structured pruning only. Valid for unstructured: l1, l2."
        )
    skip = {id(m) for m in ignored}
    targets = [(m, "weight") for m in prunable_layers(model).values() if id(m) not in skip]
    if not targets:
        raise ConfigError("no Conv or Linear layer is left to prune (all are ignored).")
    if global_pruning:
        prune.global_unstructured(targets, pruning_method=prune.L1Unstructured, amount=float(ratio))
    else:
        for m, name in targets:
            prune.l1_unstructured(m, name, amount=float(ratio))
    if permanent:
        make_permanent(model)
    return model


def make_permanent(model: nn.Module) -> nn.Module:
    """Bake every pruning mask into its weight (``prune.remove``)."""
    from torch.nn.utils import prune

    for m in model.modules():
        for hook in list(m._forward_pre_hooks.values()):
            if isinstance(hook, prune.BasePruningMethod):
                prune.remove(m, hook._tensor_name)
    return model


def graph_breakers(model: nn.Module, example: Any) -> dict[str, list[str]]:
    """Layers whose output leaves the autograd graph although an input was in it, each with the
    prunable layers that ran before it (whose output channels it hides).

    Torch-Pruning follows ``grad_fn`` links to find which layers share channels; a layer that
    detaches (``.detach()``, ``torch.no_grad()``, a NumPy round trip) hides its neighbours.
    """
    found: dict[str, list[str]] = {}
    ran: list[str] = []
    prunable = {id(m) for m in prunable_layers(model).values()}

    def hook(name: str) -> Callable[[nn.Module, Any, Any], None]:
        def check(m: nn.Module, args: Any, out: Any) -> None:
            ins = [a for a in args if isinstance(a, torch.Tensor)]
            outs = [out] if isinstance(out, torch.Tensor) else [
                o for o in (out if isinstance(out, (tuple, list)) else []) if isinstance(o, torch.Tensor)]
            if any(a.requires_grad for a in ins) and outs and not any(o.requires_grad for o in outs):
                found[name] = [n for n in ran if not n.startswith(name + ".")]
            if id(m) in prunable:
                ran.append(name)
        return check

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        with torch.enable_grad():
            call_model(model, _requires_grad(example))
    finally:
        for h in handles:
            h.remove()
    # an outer module that contains the breaker is reported too; keep the innermost
    return {n: before for n, before in found.items()
            if not any(o != n and o.startswith(n + ".") for o in found)}


def _requires_grad(example: Any) -> Any:
    if isinstance(example, torch.Tensor):
        return example.detach().float().requires_grad_(True) if example.is_floating_point() else example
    if isinstance(example, (tuple, list)):
        return type(example)(_requires_grad(e) for e in example)
    if isinstance(example, dict):
        return {k: _requires_grad(v) for k, v in example.items()}
    return example


def _importance(name: str, model: nn.Module) -> Any:
    tp = _tp()
    if name == "l1":
        return tp.importance.GroupMagnitudeImportance(p=1)
    if name == "l2":
        return tp.importance.GroupMagnitudeImportance(p=2)
    if name == "taylor":
        return tp.importance.GroupTaylorImportance()
    if name == "bn":
        if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            raise ConfigError(
                "importance='bn' ranks channels by BatchNorm scale, but this model has no BatchNorm "
                "layer; use l1, l2 or taylor."
            )
        return tp.importance.BNScaleImportance()
    raise ConfigError(f"importance={name!r} is unknown; valid: {', '.join(IMPORTANCES)}.")


def prune_structured(
    model: nn.Module,
    example: Any,
    ratio: float,
    *,
    importance: str = "l2",
    global_pruning: bool = False,
    ignored: Sequence[nn.Module] = (),
    round_to: int | None = None,
    ratio_dict: dict[nn.Module, float] | None = None,
    taylor_loss: Callable[[nn.Module], torch.Tensor] | None = None,
) -> nn.Module:
    """Remove the ``ratio`` least important output channels of each layer group, in place.

    ``ratio`` is the fraction of channels cut (0.5 leaves about a quarter of a conv's weights).
    ``ignored`` keeps layers whole (always include the final classifier); ``round_to`` keeps
    channel counts multiples of it; ``ratio_dict`` sets per-layer ratios (from sensitivity);
    nn.MultiheadAttention layers are pruned by whole heads. ``taylor_loss(model)`` gives the
    loss whose gradients the ``taylor`` importance needs.
    """
    tp = _tp()
    table = {id(m): n for n, m in model.named_modules()}
    kept = {table[id(m)] for m in ignored if id(m) in table}
    for breaker, before in graph_breakers(model, example).items():
        exposed = [n for n in before if n not in kept]
        if exposed:
            raise ConfigError(
                f"Torch-Pruning cannot trace through layer {breaker!r}: its output leaves the "
                "autograd graph (detach, no_grad or a NumPy round trip), so the layers feeding it "
                "cannot be kept consistent with the ones after it. Keep those layers whole with "
                f"ignore_layers={tuple(exposed)!r}, or use prune='unstructured'."
            )
    imp = _importance(importance, model)
    kwargs: dict[str, object] = {
        "importance": imp, "pruning_ratio": float(ratio), "global_pruning": global_pruning,
        "ignored_layers": list(ignored), "round_to": round_to,
        "unwrapped_parameters": _unwrapped_parameters(model),
    }
    if ratio_dict:
        kwargs["pruning_ratio_dict"] = dict(ratio_dict)
    # nn.MultiheadAttention: Torch-Pruning cuts its embedding width (every head gets narrower,
    # the residual stream with it); cutting the head count needs separate q/k/v Linear layers.
    heads = {m: m.num_heads for m in model.modules() if isinstance(m, nn.MultiheadAttention)}
    if heads and round_to is None:
        kwargs["round_to"] = math.lcm(*heads.values())
    try:
        pruner = tp.pruner.MetaPruner(model, example, **kwargs)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"Torch-Pruning could not trace the model ({type(exc).__name__}: {exc}). Keep the "
            "layer it stops at whole with ignore_layers=, or use prune='unstructured'."
        ) from exc
    if importance == "taylor":
        if taylor_loss is None:
            raise ConfigError("importance='taylor' needs gradients; pass the task's loss.")
        model.zero_grad(set_to_none=True)
        taylor_loss(model).backward()
    pruner.step()
    model.zero_grad(set_to_none=True)
    check_forward(model, example, action="structured pruning")
    return model


#: Modules whose own parameters Torch-Pruning knows how to cut.
_KNOWN = (nn.modules.conv._ConvNd, nn.Linear, nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm,
          nn.Embedding, nn.MultiheadAttention, nn.PReLU, nn.LSTM, nn.modules.instancenorm._InstanceNorm)


def _unwrapped_parameters(model: nn.Module) -> list[tuple[nn.Parameter, int]]:
    """Parameters held directly by custom modules (position embeddings, class tokens): their
    last dimension is the feature dimension that pruning narrows."""
    out = []
    for module in model.modules():
        if isinstance(module, _KNOWN):
            continue
        for p in module.parameters(recurse=False):
            if p.dim() >= 1:
                out.append((p, p.dim() - 1))
    return out


def check_forward(model: nn.Module, example: Any, *, action: str) -> None:
    """Run one forward; on failure name the layer it failed in and suggest ``ignore_layers``."""
    with torch.no_grad(), LayerHooks(model) as hooks:  # its frames stay when the forward raises
        try:
            call_model(model, example)
        except Exception as exc:
            layer = hooks.current or "<top-level forward>"
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise ConfigError(
                f"after {action} the model fails in layer {layer!r}: {type(exc).__name__}: "
                f"{first}. Torch-Pruning could not trace a dependency there (e.g. a hard-coded "
                f"shape or a detached tensor); keep that layer and the ones feeding it whole with "
                f"ignore_layers=({layer!r},), or use prune='unstructured'."
            ) from exc
