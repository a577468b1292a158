"""Static accounting: parameters, MACs and FLOPs per layer — the one place proftune counts FLOPs.

``torch.utils.flop_counter``'s formulas do the counting op by op; we fill its gaps: attention
on CPU (``_scaled_dot_product_flash_attention_for_cpu`` counts 0 there, pytorch/pytorch#195460),
the matmul forms it has no formula for (``mv``, ``addmv``, ``dot``, ``vdot``, ``addr``,
``addbmm``, ``_trilinear``: a 3-D x 1-D ``torch.matmul`` is an ``mv``; ``einsum`` and
``tensordot`` decompose into ``bmm``/``mm``, which it counts), recurrent layers (their fused
kernels are invisible to the counter) and embeddings (0 MACs, a lookup). Units follow
torchvision's "GFLOPS" column: ``macs`` are multiply-accumulates of the
forward pass; ``flops`` = 2 x ``macs`` for the matmul-like ops counted.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils import flop_counter as _fc
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .._device import call_model
from .._records import JsonRecord
from ._layers import LayerHooks
from ._records import UncountedOpEntry

__all__ = ["LayerCount", "StaticCounts", "UncountedOps", "count_model", "count_params", "op_flops", "uncounted_op"]

aten = torch.ops.aten


def _cpu_flash_forward(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any,
                       out_shape: Any = None, **kwargs: Any) -> int:
    return int(_fc.sdpa_flop_count(query_shape, key_shape, value_shape))


def _cpu_flash_backward(grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any,
                        *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return int(_fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape))


def _native_mha(query_shape: Any, key_shape: Any, value_shape: Any, embed_dim: int, *args: Any,
                out_shape: Any = None, **kwargs: Any) -> int:
    """Eval-mode fast path of nn.MultiheadAttention: q/k/v and output projections + attention."""
    *lead_q, len_q, _ = query_shape
    *_, len_k, _ = key_shape
    batch = 1
    for d in lead_q:
        batch *= int(d)
    e = int(embed_dim)
    macs = batch * e * e * (2 * len_q + 2 * len_k)  # q and out over len_q, k and v over len_k
    macs += 2 * batch * len_q * len_k * e  # QK^T and AV, all heads together
    return int(2 * macs)


# -- matmul forms the counter leaves at 0 (torch 2.x): a matrix-vector, vector-vector, outer or
#    reduced batched product is numel(out) x k MACs like any matmul; FLOPs are 2 x MACs
def _mv(mat_shape: Any, vec_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return 2 * int(mat_shape[0]) * int(mat_shape[1])


def _addmv(bias_shape: Any, mat_shape: Any, vec_shape: Any, *args: Any, out_shape: Any = None,
           **kwargs: Any) -> int:
    return _mv(mat_shape, vec_shape)


def _dot(a_shape: Any, b_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return 2 * int(a_shape[0])


def _addr(bias_shape: Any, vec1_shape: Any, vec2_shape: Any, *args: Any, out_shape: Any = None,
          **kwargs: Any) -> int:
    return 2 * int(vec1_shape[0]) * int(vec2_shape[0])


def _addbmm(bias_shape: Any, b1_shape: Any, b2_shape: Any, *args: Any, out_shape: Any = None,
            **kwargs: Any) -> int:
    b, n, k = (int(d) for d in b1_shape)
    return 2 * b * n * k * int(b2_shape[-1])


def _trilinear(i1: Any, i2: Any, i3: Any, expand1: Any, expand2: Any, expand3: Any, sumdim: Any,
               *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """``nn.Bilinear``'s kernel: one multiply-accumulate per output element and summed index
    (N x out x in1 x in2 for a bilinear layer)."""
    shapes = [_expanded(shape, dims) for shape, dims in ((i1, expand1), (i2, expand2), (i3, expand3))]
    summed = 1
    for d in sumdim:
        summed *= max(int(shape[d]) for shape in shapes)
    out = 1
    for d in out_shape or ():
        out *= int(d)
    return 2 * out * summed


def _expanded(shape: Any, dims: Any) -> list[int]:
    full = [int(d) for d in shape]
    for d in sorted(int(x) for x in dims):
        full.insert(d, 1)
    return full


def _formulas() -> dict[Any, Callable[..., int]]:
    table: dict[Any, Callable[..., int]] = dict(_fc.flop_registry)
    extra = {
        "_scaled_dot_product_flash_attention_for_cpu": _cpu_flash_forward,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_flash_backward,
        "_native_multi_head_attention": _native_mha,
        "mv": _mv, "addmv": _addmv, "dot": _dot, "vdot": _dot, "addr": _addr, "addbmm": _addbmm,
        "_trilinear": _trilinear,
    }
    for name, fn in extra.items():
        packet = getattr(aten, name, None)
        if packet is not None and packet not in table:
            table[packet] = _fc.shape_wrapper(fn)
    return table


_FORMULAS = _formulas()

#: Name parts of ops that do real arithmetic (matmul, convolution, attention, FFT, solvers,
#: recurrent kernels): such an op without a formula is reported, never counted as 0 in silence.
_HEAVY_PARTS = frozenset({
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "addr", "ger", "matmul",
    "linear", "bilinear", "einsum", "tensordot", "conv", "convolution", "attention", "fft", "rfft",
    "irfft", "lstm", "gru", "rnn", "cholesky", "svd", "qr", "eig", "eigh", "solve", "inv", "lstsq",
    "lu", "cdist",
})
#: Namespaces of torch's own ops; an op of any other namespace is a custom op.
_TORCH_NAMESPACES = frozenset({"aten", "prims", "prim", "profiler", "_c10d_functional", "c10d",
                               "_c10d_functional_autograd", "_dtensor", "debugprims"})
_RECURRENT_PARTS = frozenset({"lstm", "gru", "rnn"})


def op_flops(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], out: Any) -> int | None:
    """FLOPs of one dispatched op from the formula table; ``None`` when the table has none."""
    formula = _FORMULAS.get(func._overloadpacket)
    if formula is None:
        return None
    return int(formula(*args, **kwargs, out_val=out))


def uncounted_op(func: Any) -> bool:
    """True for an op that does arithmetic the formula table cannot count: a custom op (not
    torch's namespace), or a matmul/conv/attention-like torch op without a formula."""
    if func._overloadpacket in _FORMULAS:
        return False
    if getattr(func, "namespace", "aten") not in _TORCH_NAMESPACES:
        return True
    parts = set(str(func._overloadpacket.__name__).strip("_").split("_"))
    return bool(parts & _HEAVY_PARTS)


def _op_name(func: Any) -> str:
    name = func.name() if hasattr(func, "name") else str(func)
    return str(name)


def _shapes_of(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[list[int]]:
    leaves, _ = tree_flatten((args, kwargs))
    return [list(t.shape) for t in leaves if isinstance(t, torch.Tensor)]


class UncountedOps:
    """Ops that :func:`uncounted_op` flags, by name: their call counts and (up to 5) distinct input shapes."""

    def __init__(self) -> None:
        self.ops: dict[str, UncountedOpEntry] = {}

    def _count(self, name: str, calls: int, shapes: Iterable[list[list[int]]]) -> None:
        e = self.ops.setdefault(name, UncountedOpEntry(op=name, calls=0, shapes=[]))
        e["calls"] += calls
        for sh in shapes:
            if sh not in e["shapes"] and len(e["shapes"]) < 5:
                e["shapes"].append(sh)

    def add(self, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        self._count(_op_name(func), 1, [_shapes_of(args, kwargs)])

    def merge(self, other: UncountedOps) -> UncountedOps:
        for name, e in other.ops.items():
            self._count(name, e["calls"], e["shapes"])
        return self

    def to_list(self) -> list[UncountedOpEntry]:
        """The entries as a record holds them (copies)."""
        return [copy.deepcopy(e) for e in self.ops.values()]


_RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1, "LSTMCell": 4, "GRUCell": 3, "RNNCell": 1}


@dataclass
class LayerCount(JsonRecord):
    """Parameters and forward MACs/FLOPs of one layer (module path) or one layer type."""

    WHAT: ClassVar[str] = "a layer's count"

    name: str
    type: str
    params: int = 0
    macs: int = 0
    flops: int = 0
    calls: int = 0


@dataclass
class StaticCounts:
    """What :func:`count_model` measured for one input."""

    params_total: int
    params_trainable: int
    macs: int
    flops: int
    backward_flops: int = 0
    layers: dict[str, LayerCount] = field(default_factory=dict)
    by_type: dict[str, LayerCount] = field(default_factory=dict)
    #: Ops that do arithmetic but have no FLOP formula (custom ops, ...), NOT counted in ``flops``;
    #: empty when everything was counted.
    uncounted_ops: list[UncountedOpEntry] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "params": {"total": self.params_total, "trainable": self.params_trainable},
            "macs": self.macs, "flops": self.flops, "backward_flops": self.backward_flops,
            "layers": [c.to_dict() for c in self.layers.values()],
            "by_type": [c.to_dict() for c in self.by_type.values()],
            "uncounted_ops": [dict(e) for e in self.uncounted_ops],
        }


def count_params(model: nn.Module) -> tuple[int, int]:
    """``(total, trainable)`` parameter counts; a weight shared by several layers counts once."""
    total = trainable = 0
    for p in model.parameters():  # parameters() already yields each tensor once
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return total, trainable


def _rnn_tokens(x: Any) -> int:
    """Samples x timesteps fed to a recurrent layer (padded tensor or PackedSequence)."""
    if isinstance(x, nn.utils.rnn.PackedSequence):
        return int(x.data.shape[0])
    if isinstance(x, torch.Tensor):
        return int(x.numel() // max(int(x.shape[-1]), 1))
    return 0


def _recurrent_macs(module: nn.Module, inputs: tuple[Any, ...]) -> int:
    """MACs of a recurrent layer: every weight matrix is applied once per token (x batch)."""
    if not inputs:
        return 0
    tokens = _rnn_tokens(inputs[0])
    per_token = sum(p.numel() for name, p in module.named_parameters(recurse=False)
                    if p.dim() == 2 and name.startswith("weight"))
    return tokens * per_token


class _Counter(TorchDispatchMode):
    """Adds each op's FLOPs to the innermost running module (``current()``, None outside one)."""

    def __init__(self, current: Callable[[], str | None], suppress: list[int], *,
                 skip_recurrent: bool = False) -> None:
        super().__init__()
        self.current, self.suppress = current, suppress
        self.flops: dict[str, int] = defaultdict(int)
        self.total = 0
        self.uncounted = UncountedOps()
        # recurrent kernels whose FLOPs count_model adds per module (forward and backward)
        self.skip_recurrent = skip_recurrent

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.suppress[0]:
            return out
        flops = op_flops(func, args, kwargs, out)
        if flops is not None:
            self.flops[self.current() or ""] += flops
            self.total += flops
        elif uncounted_op(func) and not (
                self.skip_recurrent
                and set(str(func._overloadpacket.__name__).strip("_").split("_")) & _RECURRENT_PARTS):
            self.uncounted.add(func, args, kwargs)
        return out


def _scalar_for_backward(out: Any) -> torch.Tensor | None:
    leaves, _ = tree_flatten(out)
    tensors = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
    if not tensors:
        return None
    return sum(t.float().sum() for t in tensors)  # type: ignore[return-value]


def count_model(model: nn.Module, example_input: Any, *, backward: bool = False) -> StaticCounts:
    """Count parameters and forward MACs/FLOPs per layer for one ``example_input``.

    ``example_input`` is what ``model(...)`` takes: a tensor, a tuple of positional args or a
    dict of keyword args. With ``backward=True`` the backward pass of a training step is counted
    too (``backward_flops``). The model is left in the mode it was in; no parameter changes.
    """
    hooks = LayerHooks(model)
    suppress = [0]
    executed: dict[str, nn.Module] = {}
    calls: dict[str, int] = defaultdict(int)
    recurrent_flops: dict[str, int] = defaultdict(int)

    def enter(name: str, mod: nn.Module, inputs: tuple[Any, ...]) -> None:
        executed.setdefault(name, mod)
        calls[name] += 1
        if type(mod).__name__ in _RNN_GATES or isinstance(mod, (nn.RNNBase, nn.RNNCellBase)):
            recurrent_flops[name] += 2 * _recurrent_macs(mod, inputs)
            suppress[0] += 1

    def leave(name: str, mod: nn.Module) -> None:
        if isinstance(mod, (nn.RNNBase, nn.RNNCellBase)) or type(mod).__name__ in _RNN_GATES:
            suppress[0] -= 1

    hooks.enter_listeners.append(enter)
    hooks.exit_listeners.append(leave)
    counter = _Counter(lambda: hooks.current, suppress)
    backward_total = 0
    uncounted = UncountedOps()
    hooks.attach()
    try:
        if backward:
            with counter:
                out = call_model(model, example_input)
            scalar = _scalar_for_backward(out)
            if scalar is not None:
                back = _Counter(lambda: None, [0], skip_recurrent=bool(recurrent_flops))
                with back:
                    scalar.backward()
                uncounted.merge(back.uncounted)
                # fused recurrent kernels hide their backward: 2x their forward, by convention
                backward_total = back.total + 2 * sum(recurrent_flops.values())
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad(), counter:
                call_model(model, example_input)
    finally:
        hooks.detach()

    uncounted = counter.uncounted.merge(uncounted)
    layer_flops: dict[str, int] = defaultdict(int)
    for name, flops in counter.flops.items():
        layer_flops[name] += flops
    for name, flops in recurrent_flops.items():
        layer_flops[name] += flops
    layers = _assemble_layers(model, executed, calls, layer_flops)
    total, trainable = count_params(model)
    fwd_flops = sum(c.flops for c in layers.values())
    by_type: dict[str, LayerCount] = {}
    for c in layers.values():
        t = by_type.setdefault(c.type, LayerCount(name=c.type, type=c.type))
        t.params += c.params
        t.macs += c.macs
        t.flops += c.flops
        t.calls += c.calls
    return StaticCounts(params_total=total, params_trainable=trainable, macs=fwd_flops // 2,
                        flops=fwd_flops, backward_flops=backward_total, layers=layers, by_type=by_type,
                        uncounted_ops=uncounted.to_list())


def _assemble_layers(model: nn.Module, executed: dict[str, nn.Module],
                     calls: dict[str, int], flops: dict[str, int]) -> dict[str, LayerCount]:
    """One entry per executed module that holds parameters or FLOPs of its own, or is a leaf.

    A child that never ran itself (``MultiheadAttention.out_proj`` is applied functionally) is
    folded into its nearest executed ancestor, so every parameter lands in a layer that ran.
    """
    owner: dict[str, str] = {}
    for name, _mod in model.named_modules():
        if name in executed:
            owner[name] = name
        else:
            parent = name.rpartition(".")[0] if "." in name else ""
            owner[name] = owner.get(parent, "")
    layers: dict[str, LayerCount] = {}
    seen: set[int] = set()
    for name, mod in model.named_modules():
        direct = 0
        for p in mod.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                direct += p.numel()
        target = owner.get(name, "")
        is_leaf = not any(True for _ in mod.children())
        if target == name and not (direct or flops.get(name) or is_leaf):
            continue
        if target not in layers:
            tmod = executed.get(target, model)
            layers[target] = LayerCount(name=target, type=type(tmod).__name__, calls=calls.get(target, 0))
        layers[target].params += direct
    for name, f in flops.items():
        if name not in layers:
            mod = executed.get(name, model)
            layers[name] = LayerCount(name=name, type=type(mod).__name__, calls=calls.get(name, 0))
        layers[name].flops += f
        layers[name].macs += f // 2
    # keep forward order: executed modules in the order they first ran
    order = {name: i for i, name in enumerate(executed)}
    return dict(sorted(layers.items(), key=lambda kv: order.get(kv[0], len(order))))
