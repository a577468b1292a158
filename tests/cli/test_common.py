"""cli/_common.py's as_flags: the one place where a library message's Python arguments become flags."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest

from proftune.cli._common import as_flags

SRC = Path(__file__).resolve().parents[2] / "src" / "proftune"


@click.command()
@click.option("--max-failures", type=int)
@click.option("--ignore-layers", multiple=True)
@click.option("--distill", is_flag=True)
@click.option("--compile", "compile_")
@click.option("--plot")
@click.option("--prune")
@click.option("--param", multiple=True)
def _command(**_: object) -> None:
    """A command with the kinds of options the translation meets."""


@pytest.mark.parametrize(("library", "cli"), [
    ("max_failures=3 must be >= 0.", "--max-failures 3 must be >= 0."),
    ("max_accuracy_drop=-0.1 must be >= 0", "max_accuracy_drop=-0.1 must be >= 0"),  # no such option here
    ("ignore_layers= names unknown layers: x", "--ignore-layers names unknown layers: x"),
    ("keep them whole with ignore_layers=('0', '3'), or use prune='unstructured'.",
     "keep them whole with --ignore-layers 0,3, or use --prune 'unstructured'."),
    ("distill=True teaches during fine-tuning", "--distill teaches during fine-tuning"),
    ("compile='tvm' is unknown", "--compile 'tvm' is unknown"),  # the option's Python name is compile_
    ("plot_dir='x' is a file", "--plot 'x' is a file"),  # the library's name of compress's --plot
    ("param prune_ratio=0.1", "param prune_ratio=0.1"),  # a longer name is not the option's
    ("give it as params={'input_shape': '3x32x32'}.", "give it as --param input_shape=3x32x32."),
    ("params={'input_shape': (3, 32, 32), 'hidden': 8} fail", "--param input_shape=3,32,32 --param hidden=8 fail"),
    ("pass task= (and params=) to build it", "pass task= (and --param) to build it"),
])
def test_as_flags_translates_arguments_of_the_running_command(library: str, cli: str) -> None:
    with click.Context(_command):
        assert as_flags(library) == cli


def test_outside_a_command_the_message_is_unchanged() -> None:
    assert as_flags("max_failures=3 must be >= 0.") == "max_failures=3 must be >= 0."


def _flag_messages(path: Path) -> list[str]:
    """The lines of error messages (an ``...Error(...)`` or ``.add(...)`` call) naming a --flag."""
    flag = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if called == "add" or called.endswith("Error") or called == "OutputPath":
            for arg in node.args:
                for s in ast.walk(arg):
                    if isinstance(s, ast.Constant) and isinstance(s.value, str) and flag.search(s.value):
                        found.append(f"{path.relative_to(SRC)}:{s.lineno}: {flag.findall(s.value)}")
    return found


def test_the_library_names_its_arguments_not_flags() -> None:
    """Every module outside cli/ names its Python arguments in its messages (no module is exempt)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if not path.relative_to(SRC).as_posix().startswith("cli/"):
            found += _flag_messages(path)
    assert found == []


def test_a_failure_that_is_not_a_config_error_reads_in_flags_too() -> None:
    """A RunFailedError (exit 1) names ``db=`` like any library message; the user of the CLI reads ``--db``."""
    import typer
    from typer.testing import CliRunner

    from proftune.cli._common import execute
    from proftune.exceptions import RunFailedError

    app = typer.Typer()

    @app.command()
    def main(db: str = typer.Option("x.db", "--db")) -> None:
        def body() -> None:
            raise RunFailedError(f"db={db!r} went away while writing; rerun with the same db=")
        execute(body, json_out=False)

    result = CliRunner().invoke(app, ["--db", "bad"])
    assert result.exit_code == 1
    assert "--db 'bad' went away" in result.output
    assert "the same --db" in result.output
    assert "db='bad'" not in result.output
