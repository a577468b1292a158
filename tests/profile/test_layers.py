"""LayerHooks: the one "which module runs now" stack (timer, stats, FLOP counter, predictor, compress)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from proftune.profile import LayerHooks

SRC = Path(__file__).resolve().parents[2] / "src" / "proftune"


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class _Net(nn.Module):
    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.block = _Block()
        self.head = nn.Linear(4, 2)
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(x)
        if self.fail:
            return self.head(x[:, :3])  # 3 features into a Linear(4, 2)
        return self.head(x)


def test_current_names_the_innermost_module_and_listeners_see_every_call() -> None:
    model = _Net()
    seen: list[tuple[str, str | None]] = []
    left: list[str] = []
    hooks = LayerHooks(model)
    hooks.enter_listeners.append(lambda name, mod, inputs: seen.append((name, hooks.current)))
    hooks.exit_listeners.append(lambda name, mod: left.append(name))
    with hooks:
        model(torch.randn(2, 4))
        assert hooks.current is None  # between forwards
    assert seen == [("", ""), ("block", "block"), ("block.fc", "block.fc"), ("block.act", "block.act"),
                    ("head", "head")]
    assert left == ["block.fc", "block.act", "block", "head", ""]
    assert not hooks.attached


def test_the_frames_of_a_failing_forward_stay_readable() -> None:
    """compress names the layer a pruned model fails in from them."""
    model = _Net(fail=True)
    with LayerHooks(model) as hooks:
        with pytest.raises(RuntimeError):
            model(torch.randn(2, 4))
        assert hooks.current == "head"
        assert hooks.stack == ["", "head"]
    hooks.attach()  # a fresh attach starts from an empty stack
    assert hooks.current is None
    hooks.detach()


def test_another_models_modules_are_not_framed() -> None:
    model, other = _Net(), nn.Linear(4, 4)
    entered: list[str] = []
    hooks = LayerHooks(model)
    hooks.enter_listeners.append(lambda name, mod, inputs: entered.append(name))
    with hooks:
        other(torch.randn(1, 4))
    assert entered == []


def test_one_module_stack_in_the_source() -> None:
    """Only profile/_layers.py keeps a stack of running modules: nobody else registers torch's
    global module hooks or a pre-hook on every module of a model. The exceptions keep no stack:
    profile/_watch.py (before an unmodified script's first optimizer step it has no model to hook,
    so a global hook notes which top-level modules run, and is removed at that step; the Monitor
    then samples through LayerHooks); _thread_control.py (the thread cut-off reads the clock as each module's
    forward starts, during one measured step only); profile/_structure.py (each module's first
    input and output shapes, for one forward)."""
    exempt = ("profile/_layers.py", "profile/_watch.py", "_thread_control.py", "profile/_structure.py")
    found = []
    for path in SRC.rglob("*.py"):
        if path.relative_to(SRC).as_posix() in exempt:
            continue
        tree = ast.parse(path.read_text())
        loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.ListComp, ast.GeneratorExp))]
        in_loop = {id(c) for loop in loops for c in ast.walk(loop)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in ("register_module_forward_pre_hook", "register_module_forward_hook") or (
                    called == "register_forward_pre_hook" and id(node) in in_loop):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []
