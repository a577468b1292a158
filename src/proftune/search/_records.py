"""Reading a study: every trial in our terms, and the slot count that ``trials`` is measured in."""

from __future__ import annotations

import bisect
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import optuna
import sqlalchemy as sa
from optuna.trial import FrozenTrial, TrialState

from .._records import JsonRecord, Reader, plain, record_fields, stored_version
from ._constraints import ConstraintCheck, read_checks
from ._reeval import GroupTable

__all__ = ["ATTR", "TRIAL_SCHEMA_VERSION", "TRIAL_STATES", "SchedulePoint", "StudyView", "TrialFigures",
           "TrialRecord", "TrialResult", "counts", "slots_before", "study_view", "trial_records"]

TRIAL_STATES = ("complete", "pruned", "infeasible", "failed", "running")
ATTR = "proftune"
#: One epoch's report of a Ray trial: its ``epoch``, the objective, and the perturbed params' values.
SchedulePoint = dict[str, object]


@dataclass
class TrialFigures:
    """A trial's figures while it runs, read and written by attribute: the trial runner fills them
    in, :meth:`to_dict` is the study's user attr ``ATTR``, which :class:`TrialRecord` reads back
    (Optuna's ``Trial`` beside its ``FrozenTrial``). Not a :class:`TrialRecord` with more fields:
    that one is frozen and holds what the study adds (number, values, tags)."""

    params: dict[str, Any]
    metrics: dict[str, float] = field(default_factory=dict)
    constraints: dict[str, ConstraintCheck] = field(default_factory=dict)
    reason: str | None = None
    steps: int = 0
    train_s: float = 0.0
    gate_s: float = 0.0
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    stage: str | None = None
    run_id: int | None = None
    #: The sampler that drew the params (None, left out of the JSON: a Ray trial's, drawn by Ray's searcher).
    sampler: str | None = None
    #: The configuration's evaluations before this one, and the seed this one trains with.
    repeat: int = 0
    seed: int = 0
    # each field from here on is left out of the JSON while it is None
    #: The task's metrics after each epoch, where ``fit`` trained it.
    curve: list[dict[str, float]] | None = None
    #: A script's last lines: its Run keeps them (the local runner takes them out before the study).
    output: list[str] | None = None
    traceback: str | None = None
    state: str | None = None
    duration_s: float | None = None
    #: A Ray trial's retries and, under a scheduler, its epochs' reports (the driver adds them).
    ray_retries: int | None = None
    schedule: list[SchedulePoint] | None = None
    #: The Ray driver's own record of a trial whose worker sent none (failed after its retries, or
    #: stopped by the scheduler): its JSON has no ``stage``, ``repeat`` or ``seed``.
    from_driver: bool = False
    #: What a Ray worker's trial was told (constraint violations, flag attrs), for the driver to tell
    #: the study's trial: sent beside the JSON, not in it.
    constraints_raw: dict[str, float] = field(default_factory=dict)
    user_attrs_raw: dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """The user attr ``ATTR``: the fields' values as JSON's types, in field order."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _NOT_IN_JSON or (value is None and f.name in _LEFT_OUT_WHEN_NONE):
                continue
            if self.from_driver and f.name in _DRIVER_LEAVES_OUT:
                continue
            out[f.name] = plain(value)
        return out

    @classmethod
    def from_dict(cls, d: Any) -> TrialFigures:
        """The figures back from a Ray worker's JSON (:meth:`to_dict` with the ``*_raw`` fields)."""
        kw = record_fields(cls, d, what="a Ray worker's trial record")
        kw["constraints"] = read_checks(kw.get("constraints") or {}, what="a Ray worker's trial record")
        return cls(**kw)


_NOT_IN_JSON = frozenset({"from_driver", "constraints_raw", "user_attrs_raw"})
_DRIVER_LEAVES_OUT = frozenset({"stage", "repeat", "seed"})
_LEFT_OUT_WHEN_NONE = frozenset({"sampler", "curve", "output", "traceback", "state", "duration_s",
                                 "ray_retries", "schedule"})


@dataclass(frozen=True)
class TrialRecord(JsonRecord):
    """One trial as the search reports it (from the study's storage, in ``SearchResult.trials``);
    its trial Run holds the shorter :class:`TrialResult`. Its JSON is nested in a search result,
    whose version covers it; a key it does not define is a ConfigError."""

    WHAT: ClassVar[str] = "a search trial"
    READERS: ClassVar[dict[str, Reader]] = {"constraints": lambda t: read_checks(t, what="a search trial")}
    number: int
    state: str
    params: dict[str, Any]
    values: list[float] | None
    metrics: dict[str, float]
    constraints: dict[str, ConstraintCheck]
    reason: str | None
    duration_s: float | None
    run_id: int | None = None
    stage: str | None = None
    steps: int = 0
    train_s: float = 0.0
    gate_s: float = 0.0
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    traceback: str | None = None
    retried_from: int | None = None
    #: Ended before training (the gate or a forbid rule): not counted in ``trials``.
    gated: bool = False
    #: The sampler that drew this trial's params (class, QMC sequence).
    sampler: str | None = None
    #: What the caller attached to an enqueued trial (``search(enqueue=[...])``).
    tags: dict[str, Any] = field(default_factory=dict)
    #: The task's metrics after each epoch, as trained.
    curve: list[dict[str, float]] = field(default_factory=list)
    #: A re-evaluation: the configuration's evaluations before this one (0: a new configuration).
    repeat: int = 0
    #: The seed this evaluation ran with (the search's, plus ``repeat``).
    seed: int | None = None

    @property
    def value(self) -> float | None:
        """The first objective's value of a complete trial (None for any other state)."""
        return self.values[0] if (self.values and self.state == "complete") else None

    @property
    def epochs(self) -> int:
        """The epochs it trained (its curve's length)."""
        return len(self.curve)

    @property
    def ended(self) -> bool:
        """It ended: trained (complete, pruned, infeasible), or failed in user code (with a reason)."""
        return self.state in ("complete", "pruned", "infeasible") or (self.state == "failed" and bool(self.reason))


#: Bumped when a field of :class:`TrialResult`'s JSON changes meaning.
TRIAL_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TrialResult(JsonRecord):
    """How one trial ended, as its ``trial`` Run holds it: the trial's number, its state and why,
    the constraints as measured, the steps it trained and the seconds of training and of the gate.

    A frozen, versioned record: the search builds it when the trial ends, the Run holds
    :meth:`to_dict`, and the report reads it back through :meth:`from_dict`. The params, metrics
    and curve are the Run's own (config, metrics, curves). A trial run under Ray also counts
    Ray's retries (``ray_retries``) and has no gate or training seconds of its own.
    """

    trial: int | None
    state: str
    reason: str | None
    constraints: dict[str, ConstraintCheck]
    steps: int
    #: Seconds of training and of the profile gate (None: not measured, a trial run under Ray).
    train_s: float | None = None
    gate_s: float | None = None
    ray_retries: int | None = None
    schema_version: int = TRIAL_SCHEMA_VERSION
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("ray_retries",)

    @classmethod
    def build(cls, *, trial: int | None, state: str, reason: str | None, constraints: dict[str, ConstraintCheck],
              steps: int, train_s: float = 0.0, gate_s: float = 0.0) -> TrialResult:
        """The record of a trial that ended, its constraints as ``constraint_table`` measured them."""
        return cls(trial=trial, state=state, reason=reason, constraints=dict(constraints),
                   steps=int(steps), train_s=float(train_s), gate_s=float(gate_s))

    @classmethod
    def from_dict(cls, d: Any) -> TrialResult:
        """The record back from :meth:`to_dict`'s JSON (a ``trial`` Run's result; one recorded
        before the record had a version holds the same fields)."""
        what = "a trial's result"
        stored_version(d, what=what, current=TRIAL_SCHEMA_VERSION)
        kw = record_fields(cls, d, what=what)
        kw["constraints"] = read_checks(kw.get("constraints") or {}, what=what)
        kw["steps"] = int(kw.get("steps") or 0)
        return cls(**kw)


@dataclass(frozen=True)
class _Slot:
    number: int
    state: str  # Optuna's TrialState name
    failed: bool  # failed in user code (a finished trial, not a killed one)
    surplus: bool  # dropped before it ran: workers raced for the last slot
    gated: bool  # ended before training: the gate or a forbid rule


_FLAGS = ("failed", "surplus", "gated")
#: Trials that ended since the last look above which a look reads the whole study at once (into
#: Optuna's cache, which keeps finished trials) rather than one trial at a time.
_BULK = 8


def _slot_of(t: FrozenTrial) -> _Slot:
    return _Slot(t.number, t.state.name, *(bool(t.user_attrs.get(f"{ATTR}_{f}")) for f in _FLAGS))


class StudyView:
    """One study's trials, read incrementally: a finished trial never changes (Optuna refuses any
    update to it), so each is read once; each look reads only the trials created since the last
    one and those still running or queued. The worker loop looks before every trial, so its cost
    per trial does not grow with the study.

    Holds the slot of every trial and the record of every finished one (:func:`trial_records`'s
    terms), the counts of :func:`counts` and the complete trials' evaluations in order.
    """

    def __init__(self, study: optuna.Study) -> None:
        # weak: the view is the value of a WeakKeyDictionary keyed by the study, which a strong
        # reference from here would keep alive for ever
        self._study = weakref.ref(study)
        self.slots: dict[int, _Slot] = {}  # by trial_id
        self._finished: dict[int, TrialRecord] = {}  # by trial_id, surplus trials left out
        self._evaluations: list[tuple[dict[str, object], float]] = []
        self._groups = GroupTable()
        self._repeats = 0
        self._pending: list[int] = []  # trial_ids ended since the records were last brought up to date
        self._ended: set[int] = set()
        self._open: set[int] = set()  # trial_ids running or queued at the last look
        self._last = -1  # the greatest trial_id read
        self._done: dict[str, int] = dict.fromkeys(("trained", "gated", "failed"), 0)
        self._occupied: list[int] = []  # sorted numbers of the finished trials that hold a slot

    def refresh(self) -> StudyView:
        """Read the slots that changed since the last look (the records, when next asked for);
        returns itself."""
        for trial_id, slot in self._changed():
            self.slots[trial_id] = slot
            if slot.state in ("RUNNING", "WAITING"):
                self._open.add(trial_id)
                continue
            self._open.discard(trial_id)
            if trial_id in self._ended or slot.surplus:
                continue
            self._ended.add(trial_id)
            self._pending.append(trial_id)
            if _occupies(slot):
                bisect.insort(self._occupied, slot.number)
            if slot.gated:
                self._done["gated"] += 1
            elif slot.state in ("COMPLETE", "PRUNED") or (slot.state == "FAIL" and slot.failed):
                self._done["trained"] += 1
                self._done["failed"] += slot.state == "FAIL"
        return self

    @property
    def study(self) -> optuna.Study:
        study = self._study()
        if study is None:
            raise RuntimeError("the study of this view is gone")
        return study

    def _records(self) -> None:
        """Build the record of each trial that ended since the last call, once."""
        if not self._pending:
            return
        if len(self._pending) > _BULK:  # many at once (the first look at a long study): one read of them all
            self.study._storage.get_all_trials(self.study._study_id, deepcopy=False)
        for trial_id in self._pending:
            rec = _record(self.study._storage.get_trial(trial_id))
            self._finished[trial_id] = rec
            if rec.state == "complete" and rec.values:
                self._evaluations.append((dict(rec.params), rec.values[0]))
                self._groups.add(rec.params, rec.values[0])
            self._repeats += bool(rec.repeat)
        self._pending.clear()

    @property
    def finished(self) -> list[TrialRecord]:
        """The record of every finished trial (surplus ones left out), in the order they ended."""
        self._records()
        return list(self._finished.values())

    @property
    def evaluations(self) -> list[tuple[dict[str, object], float]]:
        """(params, first objective value) of every complete trial, in the order they ended."""
        self._records()
        return self._evaluations

    @property
    def groups(self) -> GroupTable:
        """The evaluations grouped by configuration (:func:`~proftune.search._reeval.groups`)."""
        self._records()
        return self._groups

    @property
    def repeats(self) -> int:
        """Finished re-evaluations."""
        self._records()
        return self._repeats

    def _changed(self) -> list[tuple[int, _Slot]]:
        """(trial_id, slot) of every trial created since the last look or open at it."""
        backend = getattr(self.study._storage, "_backend", self.study._storage)
        engine = getattr(backend, "engine", None)
        if engine is None:  # not an RDB storage: its trials are in memory
            out = [(t._trial_id, _slot_of(t)) for t in self.study.get_trials(deepcopy=False)
                   if t._trial_id > self._last or t._trial_id in self._open]
        else:
            query = sa.text(
                "SELECT t.trial_id, t.number, t.state, a.key FROM trials t LEFT JOIN trial_user_attributes a "
                "ON a.trial_id = t.trial_id AND a.key IN (:failed, :surplus, :gated) "
                "WHERE t.study_id = :sid AND (t.trial_id > :last OR t.trial_id IN :open)"
            ).bindparams(sa.bindparam("open", expanding=True))
            with engine.connect() as conn:
                rows = conn.execute(query, {**{f: f"{ATTR}_{f}" for f in _FLAGS}, "sid": self.study._study_id,
                                            "last": self._last, "open": sorted(self._open)}).all()
            heads: dict[int, tuple[int, str]] = {}
            flags: dict[int, set[str]] = {}
            for trial_id, number, state, key in rows:  # one row per flag the trial has (or one without)
                heads[int(trial_id)] = (int(number), str(state))
                if key is not None and key.startswith(f"{ATTR}_"):
                    flags.setdefault(int(trial_id), set()).add(key[len(ATTR) + 1:])
            out = [(i, _Slot(n, st, *(f in flags.get(i, ()) for f in _FLAGS))) for i, (n, st) in heads.items()]
        out.sort()
        if out:
            self._last = max(self._last, out[-1][0])
        return out

    def counts(self) -> dict[str, int]:
        """:func:`counts` of the study at the last look."""
        c = {**self._done, "running": 0, "waiting": 0}
        for trial_id in self._open:
            slot = self.slots[trial_id]
            if not slot.surplus:
                c["gated" if slot.gated else "running" if slot.state == "RUNNING" else "waiting"] += 1
        return c

    def slots_before(self, number: int) -> int:
        """Slot-holding trials numbered before ``number`` at the last look."""
        done = bisect.bisect_left(self._occupied, number)
        return done + sum(1 for i in self._open if self.slots[i].number < number and _occupies(self.slots[i]))


_VIEWS: weakref.WeakKeyDictionary[optuna.Study, StudyView] = weakref.WeakKeyDictionary()


def study_view(study: optuna.Study) -> StudyView:
    """The study's :class:`StudyView`, brought up to date (one per Study object)."""
    view = _VIEWS.get(study)
    if view is None:
        view = _VIEWS[study] = StudyView(study)
    return view.refresh()


def _occupies(slot: _Slot) -> bool:
    """Counts against ``trials``: trained, training or queued; not gated, not killed-and-retried, not surplus."""
    if slot.gated or slot.surplus:
        return False
    return slot.state in ("COMPLETE", "PRUNED", "RUNNING", "WAITING") or (slot.state == "FAIL" and slot.failed)


def slots_before(trial: optuna.Trial) -> int:
    """Slot-holding trials numbered before ``trial``: trial numbers order the workers' races."""
    return study_view(trial.study).slots_before(trial.number)


def counts(study: optuna.Study) -> dict[str, int]:
    """``trained`` (complete, pruned or failed in user code), ``gated``, ``running``, ``waiting``, ``failed``."""
    return study_view(study).counts()


def _state_of(t: FrozenTrial) -> str:
    rec = t.user_attrs.get(ATTR) or {}
    if t.state == TrialState.RUNNING or t.state == TrialState.WAITING:
        return "running"
    if t.state == TrialState.FAIL and rec.get("state") in ("complete", "infeasible", "pruned"):
        return "failed"  # its result was written, but the database never heard it ended (told)
    if rec.get("state") in TRIAL_STATES:
        return str(rec["state"])
    if t.state == TrialState.COMPLETE:
        return "infeasible" if any(v > 0 for v in t.constraints.values()) else "complete"
    if t.state == TrialState.PRUNED:
        return "pruned"
    return "failed"


#: The record of each finished trial read, by the id of Optuna's FrozenTrial (held, so its id is its
#: own): the studies of a process share one Optuna cache, which hands out the same FrozenTrial for
#: a finished trial each time, so each search call's analysis reads only the trials new to it.
_RECORDS: OrderedDict[int, tuple[FrozenTrial, TrialRecord]] = OrderedDict()
_RECORDS_MAX = 4096


def trial_records(study: optuna.Study) -> list[TrialRecord]:
    """Every trial of ``study`` in our terms (complete, pruned, infeasible, failed, running)."""
    return [_finished_record(t) for t in study.get_trials(deepcopy=False) if not t.user_attrs.get(f"{ATTR}_surplus")]


def _finished_record(t: FrozenTrial) -> TrialRecord:
    """:func:`_record` of ``t``, built once where ``t`` is finished (Optuna refuses to change one)."""
    if not t.state.is_finished():
        return _record(t)
    held = _RECORDS.get(id(t))
    if held is not None and held[0] is t:
        return held[1]
    rec = _record(t)
    _RECORDS[id(t)] = (t, rec)
    while len(_RECORDS) > _RECORDS_MAX:
        _RECORDS.popitem(last=False)
    return rec


def _record(t: FrozenTrial) -> TrialRecord:
    rec = t.user_attrs.get(ATTR) or {}
    state = _state_of(t)
    duration = rec.get("duration_s")
    if duration is None and t.datetime_start and t.datetime_complete:
        duration = (t.datetime_complete - t.datetime_start).total_seconds()
    reason = rec.get("reason")
    if t.state == TrialState.FAIL and not rec:
        reason = "the process running the trial died (heartbeat lost or killed); its configuration is retried"
    elif state == "failed" and rec.get("state") in ("complete", "infeasible", "pruned"):
        reason = (f"its result ({rec['state']}) was recorded but never reached the study's database (the "
                  "connection was lost before the trial was told); its configuration is retried")
    values = list(t.values) if (t.values is not None and state == "complete") else None
    return TrialRecord(
        number=t.number, state=state, params=rec.get("params") or dict(t.params), values=values,
        metrics=rec.get("metrics") or {}, constraints=read_checks(rec.get("constraints") or {}, what="a trial"),
        reason=reason, duration_s=duration, run_id=rec.get("run_id"),
        stage=rec.get("stage"), steps=int(rec.get("steps") or 0),
        train_s=float(rec.get("train_s") or 0.0), gate_s=float(rec.get("gate_s") or 0.0),
        anomalies=rec.get("anomalies") or [], traceback=rec.get("traceback"),
        retried_from=t.system_attrs.get("failed_trial"),
        gated=bool(t.user_attrs.get(f"{ATTR}_gated")), sampler=rec.get("sampler"),
        tags=dict(t.user_attrs.get(f"{ATTR}_tags") or {}), curve=list(rec.get("curve") or []),
        repeat=int(rec.get("repeat") or t.user_attrs.get(f"{ATTR}_repeat") or 0), seed=rec.get("seed"),
    )
