"""`--help` as a person reads it: flags without a value, arguments by name, the main job first."""

from __future__ import annotations

import os
import re
import subprocess
import sys

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
    assert re.search(r"precision, data loading, bottleneck layers and the optimizer", text)


def test_python_dash_m_proftune_is_the_console_script() -> None:
    """``python -m proftune`` runs the CLI, as ``proftune`` and ``python -m proftune.cli`` do."""
    proc = subprocess.run([sys.executable, "-m", "proftune", "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "Usage: proftune " in proc.stdout
    assert "optimize" in proc.stdout
