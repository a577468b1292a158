"""Every code block of the README runs as written, in a fresh folder, in the README's order.

A block before which the README says ``<!-- readme-test: NAME -->`` is a file (written as NAME);
``<!-- readme-test: skip (why) -->`` marks the few blocks that cannot run inside a test, with the
reason in the README itself. Everything else runs: shell lines through the CLI (in-process),
``pip install -e ".[EXTRA]"`` checked against pyproject.toml, Python blocks one after the other
in one session per section. Budgets, trials and epochs are cut (:data:`QUICK`) so that a test
takes seconds to a few minutes: what a command does does not depend on how long it may run.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from proftune.cli import app

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(r"(?:<!-- readme-test: ([^\n]+?) -->\n)?```(\w+)\n(.*?)```", re.S)
#: How the test shortens a command: (pattern, replacement). Nothing else is changed.
QUICK = [(r"--budget \S+", "--budget 40"), (r'(?<![\w])budget="[^"]+"', "budget=40"), (r"--trials \d+", "--trials 2"),
         (r"(?<![\w-])trials=\d+", "trials=2"), (r"--epochs \d+", "--epochs 1"), (r"(?<![\w_])epochs=\d+", "epochs=1"),
         (r"--rounds \d+", "--rounds 2")]
#: The tune and report examples (they train digits-cnn: a few minutes on 2 busy cores).
TUNE = ("## Search spaces", "## Reports")


@dataclass(frozen=True)
class Block:
    section: str
    line: int
    lang: str
    code: str
    marker: str | None

    @property
    def skip(self) -> str | None:
        m = re.fullmatch(r"skip \((.+)\)", self.marker or "")
        return m.group(1) if m else None

    @property
    def file(self) -> str | None:
        return self.marker if self.marker and not self.skip else None


def blocks() -> list[Block]:
    text = README.read_text()
    heads = [(m.start(), m.group(0)) for m in re.finditer(r"^## .*$", text, re.M)]
    out = []
    for m in BLOCK.finditer(text):
        section = next((h for pos, h in reversed(heads) if pos < m.start()), "(top)")
        out.append(Block(section, text[:m.start()].count("\n") + 1, m.group(2), m.group(3), m.group(1)))
    return out


def quick(code: str) -> str:
    for pattern, repl in QUICK:
        code = re.sub(pattern, repl, code)
    return code


def _extras() -> set[str]:
    """The extras pyproject.toml defines (``name = [...]`` under ``[project.optional-dependencies]``)."""
    text = (ROOT / "pyproject.toml").read_text()
    part = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^(\w+) = \[", part, re.M))


def _shell(block: Block) -> None:
    """Each command line of a shell block: ``proftune ...`` through the CLI, ``pip install`` checked."""
    joined = re.sub(r"\\\n\s*", " ", block.code)
    for line in joined.splitlines():
        for cmd in (c.strip() for c in line.split("&&")):
            args = shlex.split(quick(cmd), comments=True)
            if not args:
                continue
            if args[:3] == ["pip", "install", "-e"]:
                extra = re.fullmatch(r"\.\[(\w+)\]", args[3])
                assert extra is not None, cmd
                assert extra.group(1) in _extras(), (block.line, cmd)
                continue
            assert args[0] == "proftune", (block.line, cmd)
            result = CliRunner().invoke(app, args[1:])
            assert result.exit_code == 0, (block.line, cmd, result.output[-3000:])
            if "--emit" in args:
                assert "L.Trainer(" in result.stdout


def run_section(heading: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[Block]:
    """Run every block of the README sections starting with ``heading`` (files first written)."""
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    found = [b for b in blocks() if b.section.startswith(heading)]
    assert found, heading
    scope: dict[str, Any] = {"__name__": "__readme__"}
    for b in found:
        for name, code in _files_before(b):
            (folder / name).write_text(code)
        if b.skip or b.file:
            continue
        if b.lang == "bash":
            _shell(b)
        elif b.lang == "python":
            exec(compile(quick(b.code), f"README.md:{b.line}", "exec"), scope)
        else:
            raise AssertionError(f"README.md:{b.line}: a {b.lang} block with no readme-test marker")
    return found


def _files_before(b: Block) -> list[tuple[str, str]]:
    """Every file block of the README up to ``b`` (a section may use another's file: space.yaml)."""
    return [(x.file, x.code) for x in blocks() if x.file and x.line <= b.line]


def test_every_block_runs_in_a_test_or_says_why_not() -> None:
    found = blocks()
    assert len(found) >= 15
    covered = ("(top)", "## The main job", "## Tasks", "## Search spaces", "## Python", "## Reports",
               "## Your own training code")
    for b in found:
        assert b.section.startswith(covered), f"README.md:{b.line} ({b.section}) is run by no test"
        assert b.lang in ("bash", "python", "yaml") or b.marker, f"README.md:{b.line}: {b.lang}"
        if b.lang == "yaml":
            assert b.file, f"README.md:{b.line}: a yaml block is a file: <!-- readme-test: NAME.yaml -->"
    skipped = [(b.line, b.skip) for b in found if b.skip]
    assert len(skipped) <= 2, skipped  # CI itself, and a synopsis with placeholders


@pytest.mark.slow  # four tune and report commands on digits-cnn: 2-4 minutes on 2 busy cores
def test_search_spaces_and_reports_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tune examples (a constraint and its feasibility scan, a Pareto front) and the report ones;
    the Pareto example used to exit 2 (a staged space takes one objective)."""
    pytest.importorskip("optuna")
    pytest.importorskip("plotly")
    for heading in TUNE:
        run_section(heading, tmp_path, monkeypatch)
    html = (tmp_path / "cnn.html").read_text()
    assert "Pareto front" in html
    assert (tmp_path / "cnn-study.html").stat().st_size > 100_000
    assert (tmp_path / "plots").is_dir()


@pytest.mark.slow  # the main job at a 40 s budget, twice (the command and the Python call)
def test_the_main_job_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for heading in ("(top)", "## The main job"):
        run_section(heading, tmp_path, monkeypatch)
    summary = tmp_path / "proftune-optimize" / "digits-cnn" / "summary.json"
    assert summary.is_file()


@pytest.mark.slow  # a dozen calls that each train or profile digits-cnn (a minute or two)
def test_tasks_and_the_python_walk_through_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for heading in ("## Tasks", "## Search spaces", "## Python"):
        if heading == "## Search spaces":
            (tmp_path / "space.yaml").write_text(next(b.code for b in blocks() if b.file == "space.yaml"))
            continue
        run_section(heading, tmp_path, monkeypatch)
    assert (tmp_path / "lr.png").is_file()
    assert (tmp_path / "cnn.json").is_file()


@pytest.mark.slow  # minutes on a loaded 2-core machine: the commands it runs are tested on their own
def test_readme_integration_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    pytest.importorskip("timm")
    try:
        found = run_section("## Your own training code", tmp_path, monkeypatch)
        assert [b.lang for b in found] == ["python", "bash", "python", "python", "python", "bash"]
    finally:
        sys.modules.pop("lit_digits", None)
        sys.modules.pop("timm_user", None)
