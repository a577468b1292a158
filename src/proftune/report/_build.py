"""Build report pages: a run, a study, a saved profile, or two runs side by side."""

from __future__ import annotations

import webbrowser
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._jsonsafe import json_dumps
from .._paths import OutputPath, check_outputs, write_text
from .._report_writers import REPORT_WRITERS
from ..exceptions import ConfigError
from ..profile import Profile
from ..track import RunRecord, Store, open_store
from . import (  # noqa: F401  (they register their pages)
    _compress_page,
    _diagnose_page,
    _optimize_page,
    _predict_page,
    _recommend_page,
)
from ._common import RENDERERS, Context, curves, overview
from ._figures import PALETTE, layout, line
from ._html import Page
from ._profile_page import profile_sections
from ._tune_page import study_sections

__all__ = ["compare_html", "render_report", "run_id_of", "run_page", "write_compare_report", "write_report"]

_TITLES = {"train": "training run", "profile": "profile", "recommend": "recommendations",
           "batch_size": "batch size", "lr_find": "LR range test", "tune": "study", "trial": "trial",
           "compress": "compression", "diagnose": "diagnosis", "bandit": "bandit", "optimize": "optimize",
           "predict": "prediction"}


def run_id_of(result: Any) -> int | None:
    """The id of the Run a command's result was recorded as (None when it was not)."""
    if isinstance(result, RunRecord):
        return result.id
    if isinstance(result, Mapping):
        rid = result.get("run_id")
        return int(rid) if isinstance(rid, int) else None
    for holder in (result, getattr(result, "recs", None)):
        rid = getattr(holder, "run_id", None)
        if isinstance(rid, int):
            return rid
    config = getattr(result, "config", None)  # a Profile keeps its run id in its config
    if isinstance(config, Mapping) and isinstance(config.get("run_id"), int):
        return int(config["run_id"])
    return None


def _store(store: Store | str | None, db: str | None) -> Store:
    return open_store(store, db=db)


def render_report(source: Any = None, *, study: str | None = None, store: Store | str | None = None,
                  db: str | None = None) -> str:
    """The HTML of one report.

    ``source``: a run id, a :class:`RunRecord`, a command's result (anything with a ``run_id``),
    a :class:`proftune.Profile`, a profile's dict, or the path of a saved profile JSON;
    ``study``: the name of a study in the store instead.
    """
    if study is not None:
        return _study_page(study, _store(store, db)).render()
    if source is None:
        raise ConfigError("give a run id, a result, a profile (object or JSON file) or study=NAME.")
    if isinstance(source, (str, Path)) and not str(source).isdigit():
        return _profile_page(Profile.load(Path(source))).render()
    if isinstance(source, Profile):
        rid = run_id_of(source)
        if rid is None:
            return _profile_page(source).render()
    if isinstance(source, Mapping) and "schema_version" in source and "layers" in source:
        return _profile_page(Profile.from_dict(dict(source))).render()
    if isinstance(source, RunRecord):
        return run_page(source, _store(store, db)).render()
    rid = int(source) if isinstance(source, (int, str)) else run_id_of(source)
    if rid is None:
        raise ConfigError(f"this result ({type(source).__name__}) was not recorded as a run; "
                          "give a run id, a profile or study=NAME.")
    st = _store(store, db)
    return run_page(st.get_run(rid), st).render()


def write_report(source: Any = None, out: str | Path | None = None, *, study: str | None = None,
                 store: Store | str | None = None, db: str | None = None, open_browser: bool = False,
                 force: bool = True) -> Path:
    """Write the report of ``source`` (see :func:`render_report`) to ``out`` as one HTML file.

    Default ``out``: ``report-<run id>.html`` / ``report-<study>.html`` / ``<profile>.html``.
    The path is checked before the report is built; ``force=False`` (the CLI without
    ``--force``) refuses to replace an existing file.
    """
    path = Path(out) if out is not None else Path(_default_name(source, study))
    check_outputs([OutputPath("out=", path)], force=force)
    text = render_report(source, study=study, store=store, db=db)
    return _write(path, text, open_browser)


REPORT_WRITERS.add(write_report, name="html")  # how the units below report write one (optimize's report.html)


def _default_name(source: Any, study: str | None) -> str:
    if study is not None:
        return f"report-{''.join(c if c.isalnum() or c in '-_' else '_' for c in study)}.html"
    if isinstance(source, (str, Path)) and not str(source).isdigit():
        return str(Path(source).with_suffix(".html").name)
    rid = int(source) if isinstance(source, (int, str)) else run_id_of(source)  # str: digits (above)
    return f"report-{rid}.html" if rid is not None else "report.html"


def _write(path: Path, text: str, open_browser: bool) -> Path:
    write_text(path, text)
    if open_browser:
        webbrowser.open(path.resolve().as_uri())
    return path


#: Kinds whose story comes first and whose overview closes the page, with the title of its config
#: panel (an optimize run's config is how it started: the task's defaults, not the result).
_OVERVIEW_LAST = {"optimize": "as started: options and the task's defaults (the result: see What changed)",
                  "tune": "the study's config (the best trial: see Study)"}


def run_page(r: RunRecord, store: Store | None = None) -> Page:
    """The page of one run: the overview, then what its kind holds."""
    what = _TITLES.get(r.kind, r.kind)
    page = Page(f"{r.task} — {what} (run {r.id})", subtitle=f"started {r.started_at[:19].replace('T', ' ')}"
                + (f" · {r.duration_s:.1f} s" if r.duration_s is not None else ""),
                badges=[(r.kind, "kind"), (r.status, r.status)])
    renderer = RENDERERS.get(r.kind)
    if r.kind not in _OVERVIEW_LAST:
        overview(page, r)
    if renderer is not None:
        renderer(page, r, Context(store))
        if r.kind in _OVERVIEW_LAST:
            overview(page, r, title="Run and environment", config_title=_OVERVIEW_LAST[r.kind], show_stats=False)
    else:
        curves(page, r)
        if r.result:
            page.section("Result").json(r.result, title="everything the run holds")
    return page


def _profile_page(p: Profile) -> Page:
    page = Page(f"{p.task or 'model'} — profile", subtitle=f"{p.device} · batch {p.batch_size}",
                badges=[("profile", "kind"), (p.mode, "mode")])
    profile_sections(page, p)
    if p.env:
        page.section("Environment").kv([(k, str(v)) for k, v in p.env.items() if not isinstance(v, Mapping)])
    return page


def _study_page(name: str, store: Store) -> Page:
    tunes = store.list_runs(kind="tune", study=name)
    trials = store.list_runs(kind="trial", study=name)
    if not tunes and not trials:
        studies = sorted({r.study for r in store.list_runs(kind="tune", limit=200) if r.study})
        raise ConfigError(f"study={name!r} has no runs in {store.shown_url}; studies: "
                          f"{', '.join(studies) if studies else 'none yet (run proftune tune)'}.")
    task = (tunes or trials)[0].task
    page = Page(f"{task} — study {name}", subtitle=f"{len(trials)} trials · {len(tunes)} tune run(s)",
                badges=[("study", "kind")])
    study_sections(page, tunes, trials)
    if tunes:
        overview(page, tunes[0], title="Run and environment", config_title=_OVERVIEW_LAST["tune"], show_stats=False)
    return page


# -- two runs -------------------------------------------------------------------------------------------
def compare_html(a: int, b: int, *, store: Store | str | None = None, db: str | None = None) -> str:
    """Two runs side by side: config, environment and data fingerprint, metrics, curves overlaid."""
    st = _store(store, db)
    d = st.compare(a, b)
    ra, rb = st.get_run(a), st.get_run(b)
    page = Page(f"run {a} vs run {b}", subtitle=f"{ra.task} ({ra.kind}) · {rb.task} ({rb.kind})",
                badges=[("compare", "kind")])
    s = page.section("Summary")
    fp = d["data_fingerprint"]
    s.kv([("task", f"{ra.task} / {rb.task}" + ("" if d["task"]["same"] else " (different tasks)")),
          ("kind", f"{ra.kind} / {rb.kind}"), ("status", f"{ra.status} / {rb.status}"),
          ("data", f"{fp['a']} / {fp['b']}: " + ("same data" if fp["match"] else "DIFFERENT data")),
          ("duration", f"{ra.duration_s or 0:.1f} s / {rb.duration_s or 0:.1f} s")])
    ms = page.section("Metrics")
    ms.table(["metric", f"run {a}", f"run {b}", "b − a"],
             [[k, v["a"], v["b"], v["delta"]] for k, v in d["metrics"].items()])
    cs = page.section("Config")
    if d["config"]:
        cs.table(["key", f"run {a}", f"run {b}"], [[k, _text(v["a"]), _text(v["b"])] for k, v in d["config"].items()],
                 title="what differs")
    else:
        cs.para("the configs are the same", cls="muted")
    es = page.section("Environment")
    if d["env"]:
        es.table(["key", f"run {a}", f"run {b}"], [[k, _text(v["a"]), _text(v["b"])] for k, v in d["env"].items()],
                 title="what differs")
    else:
        es.para("the environments are the same", cls="muted")
    _overlay(page, ra, rb)
    return page.render()


def write_compare_report(a: int, b: int, out: str | Path, *, store: Store | str | None = None,
                         db: str | None = None, open_browser: bool = False, force: bool = True) -> Path:
    """Write :func:`compare_html` to ``out`` (checked first; ``force=False`` keeps an existing file)."""
    check_outputs([OutputPath("out=", out)], force=force)
    return _write(Path(out), compare_html(a, b, store=store, db=db), open_browser)


def _text(v: Any) -> str:
    return "-" if v is None else (json_dumps(v) if isinstance(v, (dict, list)) else str(v))


def _overlay(page: Page, ra: RunRecord, rb: RunRecord) -> None:
    charts = []
    for scope, xkey in (("step", "step"), ("epoch", "epoch")):
        pa, pb = ra.curve(scope), rb.curve(scope)
        keys = [k for k in dict.fromkeys([*(pa[-1] if pa else {}), *(pb[-1] if pb else {})])
                if k not in (xkey, "epoch", "step", "samples", "epoch_s", "elapsed_s")]
        for k in keys:
            if not any(isinstance(p.get(k), (int, float)) for p in [*pa, *pb]):
                continue
            data = []
            for run, pts, color in ((ra, pa, PALETTE[0]), (rb, pb, PALETTE[1])):
                if pts:
                    data.append(line([p.get(xkey) for p in pts], [p.get(k) for p in pts], f"run {run.id}",
                                     color=color, markers=scope == "epoch", width=1.5))
            charts.append({"data": data, "layout": layout(f"{k} per {scope}", x=scope, y=k)})
    if charts:
        s = page.section("Curves")
        for fig in charts:
            s.chart(fig)
