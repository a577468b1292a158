"""Every code block of the README runs as written, in a fresh folder, in the README's order
(the mechanism, shared with the site's pages, is :mod:`tests.docs._blocks`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ._blocks import ROOT, Block
from ._blocks import blocks as page_blocks
from ._blocks import run_section as run_page_section

README = ROOT / "README.md"
#: The tune and report examples (they train digits-cnn: a few minutes on 2 busy cores).
TUNE = ("## Search spaces", "## Reports")


def blocks() -> list[Block]:
    return page_blocks(README)


def run_section(heading: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[Block]:
    return run_page_section(README, heading, folder, monkeypatch)


def test_every_block_runs_in_a_test_or_says_why_not() -> None:
    found = blocks()
    assert len(found) >= 15
    covered = ("(top)", "## The main job", "## Tasks", "## Search spaces", "## Python", "## Reports",
               "## Your own training code")
    for b in found:
        assert b.section.startswith(covered), f"{b.where} ({b.section}) is run by no test"
        assert b.lang in ("bash", "python", "yaml") or b.marker, f"{b.where}: {b.lang}"
        if b.lang == "yaml":
            assert b.file, f"{b.where}: a yaml block is a file: <!-- readme-test: NAME.yaml -->"
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
