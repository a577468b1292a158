"""A diagnosis: one :class:`Finding` per suspected cause, ranked by causality, then severity.

A finding carries its evidence (the measured numbers, the step and the layer), a severity and a
fix. A finding whose symptoms another finding explains (a NaN that followed exploding gradients,
dead units after an exploding update, a noisy loss behind batch norm over two samples) is not
listed as a rival: it is attached to the finding that explains it as one of its
``consequences``, so the top-level list holds root causes only, the first one the cause an
engineer should fix first. Each finding says in ``why`` where it was ranked and for what reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .._records import mapping, record_fields
from .._registry import LiveSequence
from ..exceptions import ConfigError
from ._causes import CHECK_REGISTRY

__all__ = ["CAUSES", "SEVERITIES", "Finding", "flatten_findings", "rank_findings"]

SEVERITIES = ("info", "warning", "error")
_SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}

#: Every cause a check can name, in the order an engineer follows them for a bad loss curve (the
#: order the checks were registered in; a plug-in's cause comes after the built-ins).
CAUSES: Sequence[str] = LiveSequence(lambda: tuple(CHECK_REGISTRY))


def _order(cause: str) -> int:
    names = CHECK_REGISTRY.names()
    return names.index(cause) if cause in names else len(names)


def _explains(cause: str) -> tuple[str, ...]:
    """The causes whose findings a finding of ``cause`` accounts for (its check's ``explains``)."""
    check = CHECK_REGISTRY.get(cause)
    return tuple(getattr(check, "explains", ())) if check is not None else ()


#: Demotion factor of the confidence of an explained finding.
_EXPLAINED_FACTOR = 0.5
#: A finding explains a later one only when it is at least this fraction as confident.
_MIN_RELATIVE_CONFIDENCE = 0.75


@dataclass(frozen=True)
class Finding:
    """One suspected cause of bad training, with the measurements behind it.

    ``confidence`` (0..1) is the check's belief that this is a real cause; ``step`` is the
    optimizer step at which the symptom was first seen (its onset) and ``layer`` the module path
    it points at, when it points at one.
    """

    cause: str
    severity: str
    summary: str
    fix: str
    #: The measured numbers behind it (a JSON object: numbers, strings, nested objects).
    evidence: Mapping[str, object] = field(default_factory=dict)
    confidence: float = 0.5
    step: int | None = None
    layer: str | None = None
    explained_by: str | None = None
    #: The findings this one explains (its symptoms), each with ``explained_by`` set; filled by
    #: :func:`rank_findings`.
    consequences: tuple[Finding, ...] = ()
    #: Why the finding stands where it does in the ranking (one sentence).
    why: str = ""
    #: The check saw a root cause of this run (it explains other findings whatever their
    #: confidence); not part of the record, only of the ranking.
    root: bool = field(default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        problems = []
        if self.cause not in CAUSES:
            problems.append(f"cause={self.cause!r} is unknown; valid: {', '.join(CAUSES)}.")
        if self.severity not in SEVERITIES:
            problems.append(f"severity={self.severity!r} is unknown; valid: {', '.join(SEVERITIES)}.")
        if not 0.0 <= self.confidence <= 1.0:
            problems.append(f"confidence must be in [0, 1], but got confidence={self.confidence}.")
        if problems:
            raise ConfigError(problems)

    def to_dict(self) -> dict[str, object]:
        return {
            "cause": self.cause, "severity": self.severity, "summary": self.summary,
            "evidence": {**self.evidence, "step": self.step, "layer": self.layer},
            "fix": self.fix, "confidence": round(self.confidence, 3), "explained_by": self.explained_by,
            "why": self.why, "consequences": [c.to_dict() for c in self.consequences],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> Finding:
        """The finding back from :meth:`to_dict`'s JSON (its step and layer are in its evidence); a
        key it does not define or a missing cause, severity, summary or fix is a ConfigError."""
        kw = record_fields(cls, mapping(d, what="a diagnosis finding"), what="a diagnosis finding")
        evidence = dict(kw.pop("evidence", None) or {})
        kw.setdefault("step", evidence.pop("step", None))
        kw.setdefault("layer", evidence.pop("layer", None))
        kw["consequences"] = tuple(cls.from_dict(c) for c in kw.get("consequences") or ())
        return cls(**{**kw, "evidence": evidence, "confidence": float(kw.get("confidence", 0.5)),
                      "why": str(kw.get("why") or "")})


def flatten_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Every finding of a ranking, each root followed by its consequences (for logs and filters)."""
    out: list[Finding] = []
    for f in findings:
        out.append(f)
        out.extend(f.consequences)
    return out


def _onset(f: Finding) -> float:
    return float(f.step) if f.step is not None else math.inf


def _at(f: Finding) -> str:
    return f"step {f.step}" if f.step is not None else "the end of the run"


def _can_explain(g: Finding, f: Finding, roots: set[str]) -> bool:
    """Whether ``g`` accounts for ``f``: a cause that can produce it, and a root cause of the run
    or one seen no later than ``f`` with a comparable confidence."""
    if f.cause not in _explains(g.cause) or f.cause in roots:
        return False
    if g.cause in roots or f.evidence.get("attributed_to") == g.cause:
        return True  # a root cause, or the cause that f's own check named
    return (g.severity != "info" and _onset(g) <= _onset(f)
            and g.confidence >= _MIN_RELATIVE_CONFIDENCE * f.confidence)


def _explanation(g: Finding, f: Finding, roots: set[str]) -> str:
    if f.evidence.get("attributed_to") == g.cause and g.cause not in roots:
        return f"explained by {g.cause}: the {f.cause} check names it as the cause ({_at(g)})"
    if g.cause in roots:
        return (f"explained by {g.cause}: a root cause of this run (seen from {_at(g)}), which can "
                f"produce {f.cause} (seen from {_at(f)})")
    return f"explained by {g.cause}: seen from {_at(g)}, no later than this ({_at(f)}), and it can produce {f.cause}"


def _versus(f: Finding, above: Finding) -> str:
    """Why ``f`` is ranked below ``above`` (two independent root findings)."""
    sa, sf = _SEVERITY_RANK[above.severity], _SEVERITY_RANK[f.severity]
    if sa != sf:
        return f"ranked below {above.cause}: severity {f.severity} < {above.severity}"
    if len(above.consequences) != len(f.consequences):
        return (f"ranked below {above.cause}: both {f.severity}; {above.cause} explains "
                f"{len(above.consequences)} other finding(s), this {len(f.consequences)}")
    if above.confidence != f.confidence:
        return (f"ranked below {above.cause}: both {f.severity}; confidence {f.confidence:.2f} < "
                f"{above.confidence:.2f}")
    return f"ranked below {above.cause}: both {f.severity}, as confident; {above.cause} was seen earlier"


def rank_findings(findings: Iterable[Finding], *, roots: Sequence[str] = ()) -> list[Finding]:
    """Root causes first, each with the findings it explains attached; one finding per cause.

    ``g`` explains ``f`` when ``g``'s cause can produce ``f``'s (its check's ``explains``) and either ``g`` is
    a root cause of the run (``roots``, or a finding marked ``root``: a layer initialised far off
    scale, labels in order, batch norm over two samples) or ``g`` was seen no later than ``f``
    and is about as confident. Findings are considered in the order roots, onset, confidence, so
    an explanation always points back and never forms a cycle. An explained finding keeps its
    severity, loses half its confidence, and is listed under its root (``consequences``, in onset
    order), not beside it. A root takes the highest severity among its consequences (the damage
    it does). Roots are ordered by severity, then the number of findings they explain, then
    confidence, then onset.
    """
    best: dict[str, Finding] = {}
    for f in findings:
        if f.cause not in best or f.confidence > best[f.cause].confidence:
            best[f.cause] = f
    root_set = set(roots) | {f.cause for f in best.values() if f.root}
    order = sorted(best.values(), key=lambda f: (f.cause not in root_set, _onset(f), -f.confidence,
                                                 _order(f.cause)))
    parent: dict[str, Finding] = {}

    def top_of(f: Finding) -> Finding:
        while f.cause in parent:
            f = parent[f.cause]
        return f

    # a check that names the cause of its symptom (oscillating loss: "the learning rate") is
    # explained by that cause's finding whatever their onsets
    for f in order:
        g = best.get(str(f.evidence.get("attributed_to")))
        if g is not None and g is not f and _can_explain(g, f, root_set) and top_of(g) is not f:
            parent[f.cause] = g
    for i, f in enumerate(order):
        if f.cause in parent:
            continue
        candidates = [g for g in order[:i] if _can_explain(g, f, root_set) and top_of(g) is not f]
        if candidates:
            parent[f.cause] = max(candidates, key=lambda g: (g.cause in root_set, g.confidence))

    tops = [f for f in order if f.cause not in parent]
    out: list[Finding] = []
    for top in tops:
        below = [f for f in order if f.cause in parent and top_of(f).cause == top.cause]
        below.sort(key=lambda f: (_onset(f), _order(f.cause)))
        consequences = tuple(
            replace(f, confidence=f.confidence * _EXPLAINED_FACTOR, explained_by=parent[f.cause].cause,
                    why=_explanation(parent[f.cause], f, root_set))
            for f in below)
        worst = max([top, *below], key=lambda f: _SEVERITY_RANK[f.severity])
        out.append(replace(top, consequences=consequences, severity=worst.severity,
                           evidence={**top.evidence, "own_severity": top.severity}
                           if worst.severity != top.severity else top.evidence))
    out.sort(key=lambda f: (-_SEVERITY_RANK[f.severity], -len(f.consequences), -f.confidence, _onset(f),
                            _order(f.cause)))
    ranked: list[Finding] = []
    for i, f in enumerate(out):
        if i == 0:
            why = "ranked first: the most likely root cause"
        else:
            why = _versus(f, out[i - 1])
        if f.consequences:
            why += "; it explains " + ", ".join(f"{c.cause} ({_at(c)})" for c in f.consequences)
        if "own_severity" in f.evidence:
            worst = max(f.consequences, key=lambda c: _SEVERITY_RANK[c.severity])
            why += f"; severity {f.severity} from its consequence {worst.cause}"
        ranked.append(replace(f, why=why))
    return ranked
