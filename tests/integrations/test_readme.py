"""The README's integration examples run as written (copied to a temp folder, in-process)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "## Your own training code"


def section() -> str:
    text = README.read_text()
    start = text.index(HEADING)
    end = text.index("\n## ", start + len(HEADING))
    return text[start:end]


def blocks(text: str) -> list[tuple[str, str, str | None]]:
    """(language, code, file name from a preceding ``<!-- readme-test: NAME -->``)."""
    out = []
    for m in re.finditer(r"(<!-- readme-test: (\S+) -->\n)?```(\w+)\n(.*?)```", text, re.S):
        out.append((m.group(3), m.group(4), m.group(2)))
    return out


@pytest.mark.slow  # minutes on a loaded 2-core machine: the commands it runs are tested on their own
def test_readme_integration_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    found = blocks(section())
    pytest.importorskip("timm")
    assert [lang for lang, _, _ in found] == ["python", "bash", "python", "python", "python", "bash"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        for lang, code, name in found:
            if name is not None:
                (tmp_path / name).write_text(code)
            elif lang == "bash":
                for line in code.splitlines():
                    args = shlex.split(line, comments=True)
                    assert args[0] == "proftune"
                    result = CliRunner().invoke(app, [*args[1:], "--device", "cpu"])
                    assert result.exit_code == 0, (line, result.stderr)
                    if "--emit" in args:
                        assert "L.Trainer(" in result.stdout
            else:
                exec(compile(code, f"README:{lang}", "exec"), {"__name__": "__readme__"})
    finally:
        sys.modules.pop("lit_digits", None)
        sys.modules.pop("timm_user", None)
