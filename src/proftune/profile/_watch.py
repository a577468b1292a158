"""Watch a user's unmodified script: find its training step and sample it with the Monitor.

``proftune.watch()`` (inside a script) and ``proftune run -- python train.py`` (outside it)
install two global hooks, no more:

- a global module forward pre-hook (``register_module_forward_pre_hook``) that notes the
  *root* modules, the ones called while no other module runs; it is removed as soon as the
  training step is known, so the steps after it run the model untouched;
- global optimizer step pre/post hooks (``register_optimizer_step_pre_hook``/``post_hook``): the
  first step of an optimizer names the model (the root module that ran since the last step and
  whose parameters it holds); from then on each of its steps is one ``Monitor.step`` and every
  ``every``-th is sampled as :class:`Monitor` does.

An optimizer stepped with a closure (Lightning's automatic optimisation runs forward and
backward inside ``optimizer.step(closure)``) has its closure run in the pre-hook, so that the
Monitor sees forward, backward and the optimizer's own step in their order; the optimizer gets
the loss back (a second call of the closure, LBFGS, runs it again).

With no optimizer step at all (an inference script), a root module called with gradients off is
watched instead, one forward call a step.
"""

from __future__ import annotations

import dataclasses
import runpy
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._deprecated import experimental
from ..exceptions import ConfigError
from ._monitor import Monitor
from ._records import Profile

__all__ = ["DEFAULT_EVERY", "MAX_OVERHEAD", "ScriptResult", "Watcher", "run_script", "watch"]

#: Without a given ``every``: sample every 50th step, or further apart where a sample costs more
#: than ``MAX_OVERHEAD`` of the training's time (:class:`Monitor`'s ``max_overhead``).
DEFAULT_EVERY = 50
MAX_OVERHEAD = 0.015


def _params_of(opt: torch.optim.Optimizer) -> set[int]:
    return {id(p) for g in opt.param_groups for p in g["params"]}


@dataclass
class _Watched:
    """One optimizer (or, for inference, one root module) and the Monitor on its model."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    monitor: Monitor
    others: list[str] = field(default_factory=list)  # root modules of this optimizer left out
    done: bool = False


class Watcher:
    """Global hooks that find the training step(s) of whatever runs and sample them.

    ``every``: sample every N-th step (as :class:`Monitor`); None: every ``DEFAULT_EVERY``-th,
    spaced further where a sample costs more than ``MAX_OVERHEAD`` of the training's time;
    ``steps``: stop watching after this many sampled steps (None: watch to the end). ``stats``,
    ``timing``: as the Monitor's.
    """

    def __init__(self, *, every: int | None = None, steps: int | None = None, stats: bool = True,
                 timing: bool = True, task: str | None = None) -> None:
        self.max_overhead = MAX_OVERHEAD if every is None else None
        every = DEFAULT_EVERY if every is None else every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"every must be a positive integer (sample every N-th step), but got {every=}.")
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ConfigError(f"steps must be a positive integer (sampled steps) or None, but got {steps=}.")
        self.every = every
        self.max_samples = steps
        self.stats = stats
        self.timing = timing
        self.task = task
        self.watched: dict[int, _Watched] = {}  # id(optimizer) or id(module) -> watched
        self._roots: dict[int, nn.Module] = {}  # root modules run since the last optimizer step
        self._depth = 0
        self._handles: list[Any] = []
        self._fwd_handles: list[Any] = []
        self._inference: _Watched | None = None
        self.notes: list[str] = []
        self.active = False

    # -- install / remove ---------------------------------------------------------------------
    def start(self) -> Watcher:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        if self.active:
            return self
        self.active = True
        self._handles.append(register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(register_optimizer_step_post_hook(self._opt_post))
        self._fwd_handles.append(register_module_forward_pre_hook(self._fwd_pre))
        self._fwd_handles.append(register_module_forward_hook(self._fwd_post))
        return self

    def stop(self) -> None:
        """Remove every hook and close the Monitors (their profiles stay readable)."""
        self._drop_forward_hooks()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for w in self.watched.values():
            self._close(w)
        if self._inference is not None:
            self._close(self._inference)
        self.active = False

    def _drop_forward_hooks(self) -> None:
        for h in self._fwd_handles:
            h.remove()
        self._fwd_handles.clear()

    def _close(self, w: _Watched) -> None:
        if not w.done:
            w.done = True
            w.monitor.__exit__(None, None, None)

    def __enter__(self) -> Watcher:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- finding the step -------------------------------------------------------------------------
    def _fwd_pre(self, mod: nn.Module, args: Any) -> None:
        if self._depth == 0:
            self._roots.setdefault(id(mod), mod)
            if (not torch.is_grad_enabled() and not self.watched and self._inference is None
                    and any(True for _ in mod.parameters())):
                self._start_inference(mod)
        self._depth += 1

    def _fwd_post(self, mod: nn.Module, args: Any, out: Any) -> None:
        self._depth = max(self._depth - 1, 0)

    def _start_inference(self, mod: nn.Module) -> None:
        mon = Monitor(mod, None, every=self.every, stats=self.stats, timing=self.timing, task=self.task,
                      max_overhead=self.max_overhead)
        mon.__enter__()
        w = _Watched(mod, None, mon)
        self._inference = w
        # one forward call of the root module is one step
        w_handle = mod.register_forward_hook(lambda m, a, o: self._inference_step(w))
        self._handles.append(w_handle)

    def _inference_step(self, w: _Watched) -> None:
        if w.done or self.watched:
            return
        w.monitor.step()
        self._check_done(w)

    def _adopt(self, opt: torch.optim.Optimizer) -> _Watched | None:
        held = _params_of(opt)
        matches = [(sum(p.numel() for p in m.parameters() if id(p) in held), m)
                   for m in self._roots.values()]
        matches = [(n, m) for n, m in matches if n > 0]
        if not matches:
            return None
        matches.sort(key=lambda t: -t[0])
        model = matches[0][1]
        others = [type(m).__name__ for _, m in matches[1:]]
        mon = Monitor(model, opt, every=self.every, stats=self.stats, timing=self.timing, task=self.task,
                      max_overhead=self.max_overhead)
        mon.__enter__()
        w = _Watched(model, opt, mon, others=others)
        if others:
            self.notes.append(f"{type(opt).__name__} holds the parameters of {len(matches)} root modules; "
                              f"{type(model).__name__} (the largest) is profiled, "
                              f"{', '.join(others)} not.")
        if self._inference is not None:
            self._close(self._inference)
            self._inference = None
        return w

    def _opt_pre(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        key = id(opt)
        w = self.watched.get(key)
        # the hook gets the step's own arguments, the optimizer first
        lead = args[:1] if args and args[0] is opt else ()
        rest = args[len(lead):]
        closure = kwargs.get("closure", rest[0] if rest else None)
        if callable(closure):
            with torch.enable_grad():
                loss = closure()
            if w is None:
                w = self._maybe_adopt(opt)
            calls = [0]

            def cached() -> Any:
                calls[0] += 1
                if calls[0] == 1:
                    return loss
                return closure()

            # the Monitor's own pre-hook (on the optimizer) runs after this one: after backward
            return (lead, {**{k: v for k, v in kwargs.items() if k != "closure"}, "closure": cached})
        if w is None:
            self._maybe_adopt(opt)
        return None

    def _maybe_adopt(self, opt: torch.optim.Optimizer) -> _Watched | None:
        key = id(opt)
        if key in self.watched:
            return self.watched[key]
        w = self._adopt(opt)
        if w is None:
            return None
        self.watched[key] = w
        # once a training step is known the global forward hooks go (every module call paid them);
        # an optimizer adopted later is matched by its parameters against the roots seen so far
        self._drop_forward_hooks()
        return w

    def _opt_post(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        w = self.watched.get(id(opt))
        if w is None:
            if not self._fwd_handles:
                # a second optimizer after the forward hooks went: its model is one of the roots seen
                w = self._maybe_adopt(opt)
            return
        if w.done:
            return
        w.monitor.step()
        self._check_done(w)

    def _check_done(self, w: _Watched) -> None:
        if self.max_samples is not None and w.monitor.samples >= self.max_samples:
            self._close(w)
            if all(x.done for x in self.watched.values()) and (self._inference is None or self._inference.done):
                self.stop()

    # -- results ----------------------------------------------------------------------------------
    def profiles(self) -> list[Profile]:
        """One Profile per watched model that had a sampled step, the largest model first."""
        out: list[tuple[int, Profile]] = []
        items = list(self.watched.values()) or ([self._inference] if self._inference is not None else [])
        for w in items:
            if w.monitor.samples == 0:
                continue
            p = w.monitor.profile
            extra = {"source": "watch", "model": type(w.model).__name__,
                     "optimizer": type(w.optimizer).__name__ if w.optimizer is not None else None}
            if w.optimizer is None:
                p = dataclasses.replace(p, mode="inference", config={**p.config, **extra})
            else:
                p = dataclasses.replace(p, config={**p.config, **extra})
            out.append((p.params.total, p))
        out.sort(key=lambda t: -t[0])
        return [p for _, p in out]

    @property
    def steps_seen(self) -> int:
        items = list(self.watched.values()) or ([self._inference] if self._inference is not None else [])
        return max((w.monitor.state.step for w in items), default=0)

    def summary(self) -> str:
        """What was found, in a sentence or two."""
        if not self.watched and self._inference is None:
            return "no training step was found: no optimizer stepped and no model ran."
        parts = []
        for w in self.watched.values():
            parts.append(f"{type(w.optimizer).__name__} over {type(w.model).__name__}: "
                         f"{w.monitor.state.step} steps, {w.monitor.samples} sampled")
        if not self.watched and self._inference is not None:
            w = self._inference
            parts.append(f"no optimizer stepped (inference): {type(w.model).__name__}'s forward calls, "
                         f"{w.monitor.state.step} steps, {w.monitor.samples} sampled")
        return "; ".join(parts + self.notes)


_CURRENT: list[Watcher] = []


@experimental("0.1.0", name="proftune.watch")
def watch(*, every: int | None = None, steps: int | None = None, out: str | Path | None = None,
          stats: bool = True, timing: bool = True) -> Watcher:
    """Watch the rest of this script: find its training step and sample every ``every``-th one
    (None: as :class:`Watcher`, every 50th or further apart where sampling would cost more).

    Returns the started :class:`Watcher` (``.profiles()`` at any time); with ``out`` the largest
    model's Profile is written there as JSON when the interpreter exits.
    """
    w = Watcher(every=every, steps=steps, stats=stats, timing=timing).start()
    _CURRENT.append(w)
    if out is not None:
        import atexit

        def save() -> None:
            w.stop()
            found = w.profiles()
            if found:
                found[0].save(out)
                print(f"proftune: {w.summary()}; profile saved to {out}", file=sys.stderr)
            else:
                print(f"proftune: {w.summary()}; no step was sampled (every={w.every}).", file=sys.stderr)

        atexit.register(save)
    return w


@dataclass(frozen=True)
class ScriptResult:
    """How a watched script ended and what was measured."""

    exit_code: int
    profiles: tuple[Profile, ...]
    summary: str
    steps_seen: int
    interrupted: str | None = None  # the signal's name, when a signal ended it
    error: str | None = None  # the exception that ended it, as text
    every: int = DEFAULT_EVERY  # the sampling interval (the least, with max_overhead)
    max_overhead: float | None = None  # the samples spaced by their cost to stay under it (None: every N-th)


class _Signalled(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def parse_command(command: Sequence[str]) -> tuple[str, str, list[str]]:
    """``python train.py ARGS`` or ``python -m pkg.mod ARGS`` -> (kind, target, argv)."""
    cmd = list(command)
    if cmd and Path(cmd[0]).name.startswith("python"):
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError("give the script to run after --: `proftune run -- python train.py ARGS` "
                          "(or `-- python -m pkg.module ARGS`).")
    if cmd[0] == "-m":
        if len(cmd) < 2:
            raise ConfigError("`-m` needs a module name: `proftune run -- python -m pkg.module ARGS`.")
        return "module", cmd[1], cmd[1:]
    if cmd[0].startswith("-"):
        raise ConfigError(f"python option {cmd[0]!r} is not supported by `proftune run`; valid: a script "
                          "path or -m MODULE.")
    path = Path(cmd[0])
    if not path.is_file():
        raise ConfigError(f"script {cmd[0]!r} does not exist (give `-- python path/to/train.py ARGS`).")
    return "path", str(path), cmd


def run_script(command: Sequence[str], *, every: int | None = None, steps: int | None = None,
               stats: bool = True, timing: bool = True,
               on_signal: Callable[[str], None] | None = None) -> ScriptResult:
    """Run ``python train.py ARGS`` (or ``-m module``) unchanged in this process, watched.

    The script sees its own ``sys.argv`` and runs as ``__main__``; a ``SystemExit`` is its exit
    code, an exception exit code 1 (its traceback printed as Python would), SIGTERM/SIGINT end it
    as interrupted (exit 128 + signal). What was sampled before the end is in the profiles.
    """
    kind, target, argv = parse_command(command)
    task = Path(target).stem if kind == "path" else target
    watcher = Watcher(every=every, steps=steps, stats=stats, timing=timing, task=task)
    saved_argv, saved_path = sys.argv, list(sys.path)
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: Any) -> None:
        raise _Signalled(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
    code, interrupted, error = 0, None, None
    sys.argv = argv
    if kind == "path":
        sys.path.insert(0, str(Path(target).resolve().parent))
    watcher.start()
    try:
        if kind == "path":
            runpy.run_path(target, run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        c = exc.code
        code = c if isinstance(c, int) else (0 if c is None else 1)
        if not isinstance(c, int) and c is not None:
            print(c, file=sys.stderr)
    except _Signalled as exc:
        interrupted = str(exc)
        code = 128 + exc.signum
        if on_signal is not None:
            on_signal(interrupted)
    except KeyboardInterrupt:
        interrupted, code = "SIGINT", 130
    except Exception as exc:  # noqa: BLE001 - the user's script failed: its traceback, then its exit code
        import traceback

        traceback.print_exc()
        code, error = 1, f"{type(exc).__name__}: {exc}"
    finally:
        watcher.stop()
        sys.argv, sys.path[:] = saved_argv, saved_path
        for num, old in previous.items():
            signal.signal(num, old)
        sys.stdout.flush()
    return ScriptResult(exit_code=code, profiles=tuple(watcher.profiles()), summary=watcher.summary(),
                        steps_seen=watcher.steps_seen, interrupted=interrupted, error=error,
                        every=watcher.every, max_overhead=watcher.max_overhead)
