"""`--help` as a person reads it: flags without a value, arguments by name, the main job first."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from proftune.cli import app


def _help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_flags_show_no_value_and_arguments_their_name() -> None:
    text = _help("optimize")
    assert "Usage: proftune optimize [OPTIONS] TASK" in text
    assert "{task}" not in text
    assert "<bool>" not in text
    assert re.search(r"--resume\s+Continue the run", text)  # a flag: no value after it
    assert re.search(r"--budget\s+TEXT\s", text)
    assert re.search(r"--seeds\s+INTEGER\s", text)
    runs = _help("runs", "show")
    assert "Usage: proftune runs show [OPTIONS] RUN_ID" in runs
    assert "<bool>" not in runs


def test_the_main_job_is_listed_first_and_descriptions_read_as_sentences() -> None:
    text = _help()
    commands = re.findall(r"^│ (\S+)\s{2,}", text.split("Commands")[1], re.M)
    assert commands[0] == "optimize", commands
    assert "<bool>" not in text
    # a docstring's line breaks are joined, not kept mid-sentence
    assert re.search(r"precision, data loading and bottleneck layers", text)
