"""Each ``--flag`` is declared once: a flag several commands take has one help text, each command
adding at most its own clause after it; an option that takes a registered kind lists the names
registered when --help is shown, a plug-in's among them."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import typer.main
from typer.testing import CliRunner

from proftune import metrics
from proftune.cli import _options as opt
from proftune.cli import app
from proftune.compress import COMPILER_REGISTRY, COMPRESS_METHODS, QUANT_BACKEND_REGISTRY
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


def _declared(own_help_only: bool) -> dict[str, set[str]]:
    """Each --flag: the cli files whose source declares it (``typer.Option``, ``_options.unset`` or
    ``output`` with a help text of their own; unless ``own_help_only``, ``_options.shared`` too)."""
    makers = {"Option", "unset", "output"} | (set() if own_help_only else {"shared", "shared_output"})
    files: dict[str, set[str]] = defaultdict(set)
    for source in sorted(Path(opt.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
                continue
            flag, fn = node.args[0].value, node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if isinstance(flag, str) and flag.startswith("--") and name in makers:
                files[flag.split("/")[0]].add(source.name)
    return files


def test_a_flag_with_a_help_text_of_its_own_is_declared_in_one_file() -> None:
    assert {"--json", "--db", "--sampler", "--tensorboard"} <= set(_declared(own_help_only=True))
    several = {f: sorted(files) for f, files in _declared(own_help_only=True).items() if len(files) > 1}
    assert several == {}, "declare a flag that several commands take in _options.py (an alias, or shared())"


def test_a_flag_that_reads_the_same_in_every_command_is_one_alias() -> None:
    uses = _uses()
    declared = _declared(own_help_only=False)
    assert {"--report", "--objective", "--out"} <= set(declared)
    assert len(uses["--report"]) > 5
    same = {f: sorted(files) for f, files in declared.items()
            if len(files) > 1 and len({h for _, h in uses[f]}) == 1}
    assert same == {}, "a flag whose help is the same everywhere is one Annotated alias in _options.py"


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
    ("compress", "--quant-backend", lambda: {k.split(":")[0] for k in QUANT_BACKEND_REGISTRY.names()}),
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


def test_every_option_of_a_registered_kind_is_in_the_table_above() -> None:
    marked = set()
    for path, cmd in _commands():
        for p in cmd.params:
            text = str(getattr(p, "help_template", None) or getattr(p, "help", "") or "")
            if "@@" in text:
                marked.add((path, p.opts[0]))
    assert marked <= {(c, f) for c, f, _ in REGISTERED}, "add the option to REGISTERED"
    assert set(opt.CHOICES) >= {"samplers", "pruners", "search_backends", "optimize_stages", "metrics"}


def _listed(text: str, names: tuple[str, ...]) -> set[str]:
    """The names of ``names`` that ``text`` lists beside another of them (``a, b``, ``a or b``)."""
    one = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    pair = rf"(?<![\w.:-])({one})(?=(?:,| or|, or) ({one})(?![\w:-]))"
    return {n for m in re.finditer(pair, text) for n in m.groups()} if names else set()


def test_a_help_that_lists_names_of_a_registered_kind_lists_all_of_them() -> None:
    """No option lists a registered kind by hand (a plug-in's name would be missing): where a help
    text lists two names of a kind, every name of that kind (or of a kind holding them) is there."""
    kinds = {k: tuple(names()) for k, names in opt.CHOICES.items()}
    assert _listed("tpe, halton or grid.", kinds["samplers"]) == {"tpe", "halton", "grid"}
    partial = []
    for path, cmd in _commands():
        cmd.get_help(click.Context(cmd, info_name=path))  # fills each option's choices
        for p in cmd.params:
            text = str(getattr(p, "help", "") or "")
            whole = [set(n) for n in kinds.values() if n and all(x in text for x in n)]
            for kind, names in kinds.items():
                found = _listed(text, names)
                if found and not any(found <= w for w in whole):
                    partial.append((path, p.opts[0], kind, sorted(found)))
    assert partial == [], "list a registered kind with _options.choices(kind)"


def test_a_metric_registered_later_is_in_the_help() -> None:
    metric = metrics.register_metric(metrics.Metric("joules_per_step", "min", "J", ("step",), "energy"))
    try:
        assert "joules_per_step" in _help_of("tune", "--objective")
        res = CliRunner().invoke(app, ["optimize", "--help"], env={"COLUMNS": "300"})
        assert res.exit_code == 0, res.output
        assert "joules_per_step" in res.output
    finally:
        metrics.METRICS.remove(metric.name)
