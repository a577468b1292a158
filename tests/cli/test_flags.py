"""Each ``--flag`` is declared once: a flag several commands take has one help text, each command
adding at most its own clause after it; an option that takes a registered kind lists the names
registered when --help is shown, a plug-in's among them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import click
import pytest
import typer.main
from typer.testing import CliRunner

from proftune import metrics
from proftune.cli import _options as opt
from proftune.cli import app
from proftune.compress import COMPILER_REGISTRY, COMPRESS_METHODS
from proftune.optimize import OPTIMIZE_STAGES
from proftune.search import PRUNER_REGISTRY, SAMPLER_REGISTRY, SEARCH_BACKEND_REGISTRY
from proftune.track import RUN_KIND_REGISTRY


def _commands(cmd: Any = None, path: str = "") -> Iterator[tuple[str, click.Command]]:
    """Every subcommand (``runs list`` too), as typer builds it."""
    cmd = cmd if cmd is not None else typer.main.get_command(app)
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield path, cmd
        return
    for name, sub in subs.items():
        yield from _commands(sub, f"{path} {name}".strip())


def _uses() -> dict[str, list[tuple[str, str]]]:
    """Each --flag: the (command, help as declared) of every command that takes it."""
    uses: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for path, cmd in _commands():
        for p in cmd.params:
            for flag in (o for o in getattr(p, "opts", ()) if o.startswith("--") and o != "--help"):
                uses[flag].append((path, str(getattr(p, "help", "") or "")))
    return uses


def test_a_flag_of_several_commands_has_one_help_text() -> None:
    uses = _uses()
    several = {f: u for f, u in uses.items() if len(u) > 1}
    assert {"--objective", "--constraint", "--study", "--space", "--out", "--force", "--epochs"} <= set(several)
    drift = []
    for flag, where in several.items():
        helps = {h for _, h in where}
        if len(helps) == 1:
            continue  # declared once (an Annotated alias in _options.py) or word for word the same
        stem = opt.SHARED_HELP.get(flag)
        if stem is None or any(not h.startswith(stem) for h in helps):
            drift.append((flag, sorted(where)))
    assert drift == [], "flags whose help drifts across commands (declare them with _options.shared)"


def test_flags_whose_use_is_the_same_read_the_same() -> None:
    uses = _uses()
    for flag in ("--constraint", "--max-accuracy-drop", "--report", "--json", "--db", "--seed", "--device"):
        helps = {h for _, h in uses[flag]}
        assert len(helps) == 1, (flag, uses[flag])
    objective = dict(uses["--objective"])
    assert objective["tune"] == objective["optimize"][:-1] + "; repeat for a Pareto front."
    assert dict(uses["--study"])["tune"] == dict(uses["--study"])["optimize"]


def test_a_shared_flag_must_be_known() -> None:
    with pytest.raises(ValueError, match="flag='--nope' has no shared help; valid: --batch-size"):
        opt.shared("--nope")


def _help_of(command: str, flag: str) -> str:
    """The help text of ``command``'s ``flag`` as --help shows it now (its choices filled)."""
    root = typer.main.get_command(app)
    cmd = dict(_commands(root))[command]
    cmd.get_help(click.Context(cmd, info_name=command))
    (param,) = [p for p in cmd.params if flag in getattr(p, "opts", ())]
    return str(param.help)


#: Each option that takes a registered kind, and the names registered.
REGISTERED = [
    ("tune", "--sampler", lambda: SAMPLER_REGISTRY.names()),
    ("tune", "--pruner", lambda: PRUNER_REGISTRY.names()),
    ("tune", "--backend", lambda: SEARCH_BACKEND_REGISTRY.names()),
    ("tune", "--objective", lambda: metrics.METRICS.names()),
    ("tune", "--constraint", lambda: metrics.METRICS.names()),
    ("optimize", "--objective", lambda: metrics.METRICS.names()),
    ("optimize", "--constraint", lambda: metrics.METRICS.names()),
    ("compress", "--metric", lambda: metrics.metric_names(stage="evaluate")),
    ("bandit", "--metric", lambda: metrics.metric_names(stage="evaluate")),
    ("compress", "--method", lambda: COMPRESS_METHODS.names()),
    ("compress", "--compile", lambda: COMPILER_REGISTRY.names()),
    ("runs list", "--kind", lambda: RUN_KIND_REGISTRY.names()),
    ("optimize", "--resume", lambda: tuple(OPTIMIZE_STAGES)),
]


@pytest.mark.parametrize(("command", "flag", "names"), REGISTERED, ids=[f"{c} {f}" for c, f, _ in REGISTERED])
def test_an_option_of_a_registered_kind_lists_every_registered_name(command: str, flag: str, names: Any) -> None:
    text = _help_of(command, flag)
    assert "@@" not in text
    missing = [n for n in names() if n not in text]
    assert missing == [], text
    if flag == "--resume":  # the stages in the order they run
        listed = text.split(": ", 1)[1].rstrip(").")
        assert listed.split(", ") == list(names()), text


def test_a_metric_registered_later_is_in_the_help() -> None:
    metric = metrics.register_metric(metrics.Metric("joules_per_step", "min", "J", ("step",), "energy"))
    try:
        assert "joules_per_step" in _help_of("tune", "--objective")
        res = CliRunner().invoke(app, ["optimize", "--help"], env={"COLUMNS": "300"})
        assert res.exit_code == 0, res.output
        assert "joules_per_step" in res.output
    finally:
        metrics.METRICS.remove(metric.name)
