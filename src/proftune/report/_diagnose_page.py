"""The pages of a ``diagnose`` and a ``bandit`` run: the findings, the allocation and regret."""

from __future__ import annotations

from ..diagnose import BanditResult, DiagnoseResult, Finding
from ..track import RunRecord
from ._common import Context, curves, flatten, read_result, register_renderer, short_value
from ._figures import PALETTE, bar, layout, line
from ._html import Page, esc, fmt_number


# -- diagnose ----------------------------------------------------------------------------------------
@register_renderer("diagnose")
def _diagnose(page: Page, r: RunRecord, ctx: Context) -> None:
    res = read_result(page, r, DiagnoseResult.from_dict)
    if res is None:
        curves(page, r)
        return
    s = page.section("Findings")
    if not res.findings:
        s.para("no findings: training looks healthy", cls="muted")
    cards = []
    # the ranking's order (root causes first, by causality then severity), each root's consequences after it
    numbered: list[tuple[str, Finding]] = []
    for n, root in enumerate(res.findings, start=1):
        numbered.append((str(n), root))
        numbered.extend((f"{n}.{j}", c) for j, c in enumerate(root.consequences, start=1))
    for i, f in numbered:
        ev = {**f.evidence, "step": f.step, "layer": f.layer}
        evhtml = s.side(lambda t, ev=ev: t.kv([(k, v if not isinstance(v, (dict, list)) else short_value(v))
                                               for k, v in flatten(ev)]))
        where = ([f"step {f.step}"] if f.step is not None else []) + ([f"layer {f.layer}"] if f.layer else [])
        cards.append(
            f'<div class="card {esc(f.severity)}"><div class="name">{i}. {esc(f.cause)}</div>'
            f'<div class="meta"><span class="badge {esc(f.severity)}">{esc(f.severity)}</span> confidence '
            f'{esc(fmt_number(round(f.confidence, 3)))} {esc(" · ".join(where))}'
            + (f" · explained by {esc(f.explained_by)}" if f.explained_by else "")
            + (f'</div><div class="meta">{esc(f.why)}' if f.why else "")
            + f'</div><p>{esc(f.summary)}</p><p><b>fix:</b> {esc(f.fix)}</p>'
            f"<details><summary>evidence</summary>{evhtml}</details></div>")
    if cards:
        s.html('<div class="cards">' + "".join(cards) + "</div>")
    if res.lr_test is not None:
        s.kv(list(flatten(res.lr_test.summary())), title="LR range test")
    curves(page, r, findings=res.findings)


# -- bandit --------------------------------------------------------------------------------------------
@register_renderer("bandit")
def _bandit(page: Page, r: RunRecord, ctx: Context) -> None:
    res = read_result(page, r, BanditResult.from_dict)
    if res is None:
        return
    s = page.section("Allocation")
    s.para(f"bandit {res.name} · policy {res.policy} · reward {res.metric} ({res.mode}) · best: {res.best}",
           cls="muted")
    if res.arms:
        names = [a.arm for a in res.arms]
        data = [bar(names, [a.pulls for a in res.arms], "pulls", color=PALETTE[0]),
                line(names, [a.mean for a in res.arms], f"mean {res.metric}", color=PALETTE[1],
                     yaxis="y2", markers=True)]
        data[-1]["mode"] = "markers"
        data[-1]["marker"] = {"size": 12, "color": PALETTE[1]}
        fig = {"data": data, "layout": layout("pulls and mean reward per configuration", y="pulls",
                                              yaxis2={"title": {"text": res.metric}, "overlaying": "y",
                                                      "side": "right", "showgrid": False})}
        s.chart(fig, side=s.side(lambda t: t.table(
            ["config", "pulls", "mean", "std", "params"],
            [[a.arm, a.pulls, a.mean, a.std, short_value(a.params)] for a in res.arms],
            row_classes=["best" if a.arm == res.best else "" for a in res.arms])))
    if res.regret:
        rs = page.section("Regret")
        xs = list(range(1, len(res.regret) + 1))
        rs.chart({"data": [line(xs, res.regret, res.policy, color=PALETTE[0], markers=True),
                           line(xs, res.uniform_regret, "uniform allocation", color="#868e96", dash="dash")],
                  "layout": layout("cumulative regret vs the best estimated mean", x="pull", y="regret")})
    if res.pulls:
        s.table(["round", "config", res.metric, "run"], [[p.round, p.arm, p.value, p.run_id] for p in res.pulls],
                title="pulls in this call")
