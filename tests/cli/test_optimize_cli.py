"""What ``proftune optimize`` prints: a newcomer answers from it alone what changed, whether it
helped beyond noise, whether the compressed model is faster, and why the run stopped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from proftune.cli import app


def _answers(text: str) -> dict[str, str]:
    """The summary's question -> answer lines (``  label  answer``, one line each when piped)."""
    labels = ("did it help", "what changed", "compressed model faster", "time", "stopped")
    out = {}
    for line in text.splitlines():
        for label in labels:
            if line.startswith(f"  {label} "):
                out[label] = line[len(label) + 2:].strip()
    return out


def _sections(html: str) -> list[str]:
    return re.findall(r"<section id=\"[^\"]+\"><h2>(.*?)</h2>", html)


def test_the_summary_answers_a_newcomer_s_questions(optimize_run: dict[str, object]) -> None:
    text = str(optimize_run["output"])
    result = optimize_run["result"]
    assert isinstance(result, dict)
    answers = _answers(text)
    assert set(answers) == {"did it help", "what changed", "compressed model faster", "time", "stopped"}, text
    adopted = result["vs_baseline"]["decision"] == "chosen"
    assert answers["did it help"].startswith("yes, beyond noise" if adopted else "no, not beyond noise")
    assert "paired seed" in answers["did it help"]
    changed = [r for r in result["final"]["changes"] if r["changed"]]
    if changed:  # each change beside its default, and where it came from
        for r in changed:
            assert re.search(rf"{r['param']} \S+ -> \S+ \((searched|computed|fixed)\)", answers["what changed"])
        assert "what changed against the defaults" in text
    else:
        assert answers["what changed"].startswith("nothing")
    final = result["final"]
    comp = answers["compressed model faster"]
    if final.get("compressed"):
        assert comp.startswith("yes:")
        assert "at batch 1 (" in comp
        assert f"at batch {final['batch_size']} (" in comp
        assert re.search(r"\d\.\d\dx (faster|slower)", comp)
    else:
        assert comp.startswith(("no:", "not tried:"))
    assert answers["stopped"] == result["stop_reason"]
    assert re.fullmatch(r"\d+\.?\d* s of the \d+\.?\d* s budget \(\d+%\)", answers["time"])
    # the model line says how its seed was chosen, as the race hands it back: the best on validation
    seeds = len(final.get("seeds") or [])
    assert f"seed {final['model_seed']}, the best on validation of {seeds} seeds" in " ".join(text.split())


def test_piped_it_is_plain_whole_and_rounded(optimize_run: dict[str, object]) -> None:
    text = str(optimize_run["output"])
    assert not set("┃┏━│└") & set(text)  # no box drawing: Markdown tables when piped
    assert "…" not in text  # nothing cut to the width
    # every number a person reads is rounded to a few significant digits (no 0.8936170212765957)
    decimals = re.findall(r"(?<![\w.])\d+\.\d+", text)
    assert decimals
    long = [x for x in decimals if len(x.replace(".", "").lstrip("0")) > 3]
    assert not long, long
    stage_rows = [line for line in text.splitlines() if re.match(r" (baseline|search|final|compress) +\|", line)]
    assert len(stage_rows) == 4
    assert all(re.search(r"\| \d+\.\d s +\|", line) for line in stage_rows)  # seconds, with their unit


def test_report_writes_the_run_s_page_like_every_command(optimize_run: dict[str, object]) -> None:
    page = Path(str(optimize_run["report"]))
    html = page.read_text()
    result = optimize_run["result"]
    assert isinstance(result, dict)
    assert f"(run {result['run_id']})" in html
    inside = (Path(str(optimize_run["out"])) / "report.html").read_text()
    title = re.search(r"<title>(.*?)</title>", html)
    assert title is not None
    assert title.group(0) in inside  # the same run's page as the --out folder's report.html
    assert _sections(html) == _sections(inside)


def test_an_existing_report_is_refused_before_any_work(tmp_path: Path) -> None:
    page = tmp_path / "story.html"
    page.write_text("mine")
    out = CliRunner().invoke(app, ["optimize", "digits-mlp", "--budget", "60", "--out", str(tmp_path / "out"),
                                   "--report", str(page)])
    assert out.exit_code == 2
    assert "--force" in out.output
    assert page.read_text() == "mine"
    assert not (tmp_path / "out").exists()


def test_an_absurd_budget_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    for budget in ("99999999h", "1e300"):
        out = CliRunner().invoke(app, ["optimize", "digits-mlp", "--budget", budget, "--out", str(tmp_path / "out"),
                                       "--db", f"sqlite:///{tmp_path / 'p.db'}"])
        assert out.exit_code == 2, out.output
        assert "30 days" in out.output
        assert "budget" in out.output
        assert "Traceback" not in out.output
        assert list(tmp_path.iterdir()) == []


def test_the_budget_plan_said_again_says_what_changed() -> None:
    """The plan is made again at the search's start from the time measured since the baseline:
    the second print says what changed, not a second full plan with other numbers."""
    from proftune.cli._optimize import plan_change

    first = {"race_fits": True, "left_s": 57.2, "search_s": 31.0, "trial_epochs": 2, "finalists": 2, "seeds": 3,
             "race_s": 3.1}
    again = {**first, "left_s": 53.0, "search_s": 34.4}
    assert plan_change(first, again) == ("made again from the time left: 53 s (was 57 s); "
                                         "the search ~34 s (was ~31 s)")
    assert plan_change(first, {**first, "left_s": 56.8}) == ("made again from the time left: 57 s (was 57 s); "
                                                            "the rest as planned")
    assert plan_change(first, {**again, "race_fits": False}) is None  # a new verdict: the whole plan again
