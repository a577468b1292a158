"""Every kind of table the commands print fits 100 columns, whole: a cell of numbers is never cut
(rich's "…"), long text wraps, and no value prints as a Python repr (``{'lr': 0.003}``).

The commands run in this process with their console replaced by one of 100 columns that records
(what a terminal of 100 columns, or a pipe, gets)."""

from __future__ import annotations

import importlib
import io
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import proftune.cli
from proftune.cli import app

WIDTH = 100


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> Console:
    """Every command module's ``out_console`` as one console of 100 columns that records."""
    console = Console(width=WIDTH, record=True, file=io.StringIO())
    for m in pkgutil.iter_modules(proftune.cli.__path__):
        if m.name == "__main__":  # importing it runs the app
            continue
        module = importlib.import_module(f"proftune.cli.{m.name}")
        if hasattr(module, "out_console"):
            monkeypatch.setattr(module, "out_console", console)
    return console


def _fits(text: str, *, cut_allowed: bool = False) -> None:
    lines = text.splitlines()
    assert lines, "nothing printed"
    too_long = [(len(x), x) for x in lines if len(x) > WIDTH]
    assert not too_long, too_long[:3]
    assert "{'" not in text, [x for x in lines if "{'" in x]
    bare_none = [x for x in lines if re.search(r"\bNone\b", x)]  # a missing value prints as "-"
    assert not bare_none, bare_none
    if not cut_allowed:
        assert "…" not in text, [x for x in lines if "…" in x]


def _run(*args: str) -> None:
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output


def test_train_and_the_run_tables(screen: Console, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'p.db'}"
    for lr in ("0.003", "0.01"):
        _run("train", "wine-mlp", "--epochs", "1", "--param", f"lr={lr}", "--threads", "1", "--device", "cpu",
             "--db", db)
    _run("runs", "list", "--db", db)
    _run("runs", "show", "1", "--db", db)
    _run("runs", "compare", "1", "2", "--db", db)
    _run("tasks")
    text = screen.export_text()
    _fits(text)
    assert "lr=0.003 batch_size=16 optimizer=adamw" in text  # the params as pairs, not a dict


def test_profile_tables_keep_every_number_whole(screen: Console) -> None:
    _run("profile", "digits-transformer", "--steps", "1", "--device", "cpu")
    layers = screen.export_text()
    _fits(layers)
    assert "MultiheadAttention" in layers
    _run("profile", "digits-transformer", "--structure", "--steps", "1", "--device", "cpu")
    _fits(screen.export_text(), cut_allowed=True)  # a shape list longer than 40 characters ends in "…"


@pytest.mark.parametrize("command", [
    ("recommend", "wine-mlp", "--optimizer-budget", "0", "--threads", "1"),
    ("lr-find", "wine-mlp"),
])
def test_recommendation_tables(screen: Console, tmp_path: Path, command: tuple[str, ...]) -> None:
    _run(*command, "--device", "cpu", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    text = screen.export_text()
    assert text.strip(), "the command printed no table"
    _fits(text)  # every line within 100 columns, no repr, nothing cut


def test_the_recommendations_of_a_watched_script_print_their_values_as_text(screen: Console) -> None:
    from proftune.cli._common import value_text

    assert value_text({"layer": "0", "share": 0.6312}) == "layer=0 share=0.6312"
    assert value_text([{"layer": "0.attn", "share": 0.5}, {"layer": "fc"}]) == "0.attn, fc"
    assert value_text({"sizes": [1, 2], "at": {"a": 0.1234567}}, digits=3) == "sizes=(1, 2) at=(a=0.123)"
    assert value_text(None) == "-"


@pytest.mark.slow  # trains the wine MLP and its pruned and quantized candidates (~20 s)
def test_the_compress_table(screen: Console, tmp_path: Path) -> None:
    _run("compress", "wine-mlp", "--device", "cpu", "--db", f"sqlite:///{tmp_path / 'p.db'}")
    text = screen.export_text()
    _fits(text)
    assert "structured +" in text  # the method's name wraps at its "+", not mid-word


def test_the_optimize_summary(screen: Console, optimize_run: dict[str, object]) -> None:
    from proftune.cli import _optimize

    render: Callable[[dict[str, object]], None] = _optimize._render
    render(optimize_run["result"])  # type: ignore[arg-type]
    text = screen.export_text()
    # the story's lines are whole lines when piped (grep, less); every table fits
    tables = "\n".join(x for x in text.splitlines() if x.startswith(("|", " ", "-")) and "  " not in x[:3])
    _fits(tables)
    assert "{'" not in text
