"""The compute stage's values as one typed record: what ``recommend`` measured that the search
centres on, read from the recommendations (and their typed evidence) in this one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .._jsonsafe import finite_float
from .._records import JsonRecord, Reader
from ..recommend import OptimizerEvidence, Recommendations

__all__ = ["ComputedValues", "LrCheck", "OptimizerChoice"]

#: The precisions a computed value may take.
_PRECISIONS = ("fp32", "bf16", "fp16")
#: The optimizers the search can switch to (the fit loop builds each).
_OPTIMIZERS = ("adamw", "adam", "sgd")


@dataclass(frozen=True)
class OptimizerChoice(JsonRecord):
    """Another optimizer the optimizer row measured better than the task's, at its own rate."""

    WHAT: ClassVar[str] = "the compute stage's optimizer alternative"
    optimizer: str
    lr: float
    momentum: float | None = None
    #: The JSON since it was first written: only what the row compared.
    OMIT_NONE: ClassVar[tuple[str, ...]] = ("momentum",)

    def params(self) -> dict[str, str | float]:
        """As training params (``momentum`` only where it was compared)."""
        return self.to_dict()


@dataclass(frozen=True)
class ComputedValues(JsonRecord):
    """Each value the compute stage computed (None: not computed; the search and the race use the
    task's own). Its JSON holds only the computed values, as ``state.json`` always has."""

    WHAT: ClassVar[str] = "the compute stage's values"
    READERS: ClassVar[dict[str, Reader]] = {"optimizer_alternative": OptimizerChoice.from_dict}
    batch_size: int | None = None
    lr: float | None = None
    grad_accumulation: int | None = None
    precision: str | None = None
    optimizer_alternative: OptimizerChoice | None = None

    def params(self) -> dict[str, int | float | str]:
        """The computed training params by name (``batch_size``, ``lr``, ...), those computed only."""
        return {k: v for k, v in (("batch_size", self.batch_size), ("lr", self.lr),
                                  ("grad_accumulation", self.grad_accumulation), ("precision", self.precision))
                if v is not None}

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in super().to_dict().items() if v is not None}

    @classmethod
    def from_recommendations(cls, recs: Recommendations, *, own_optimizer: str) -> ComputedValues:
        """The values ``recs`` computed; an optimizer other than ``own_optimizer`` when the optimizer
        row measured it better (the search then tries both, each at its own rate)."""
        values = {r.name: r.value for r in recs}
        alt = None
        if "optimizer" in values:
            ev = OptimizerEvidence.of(recs.get("optimizer"))
            if values["optimizer"] in _OPTIMIZERS and values["optimizer"] != own_optimizer and ev.lr:
                alt = OptimizerChoice(optimizer=ev.optimizer or str(values["optimizer"]), lr=ev.lr,
                                      momentum=ev.momentum)
        bs, accum, precision = values.get("batch_size"), values.get("grad_accumulation"), values.get("precision")
        return cls(batch_size=bs if isinstance(bs, int) else None, lr=finite_float(values.get("lr")),
                   grad_accumulation=accum if isinstance(accum, int) else None,
                   precision=precision if precision in _PRECISIONS else None, optimizer_alternative=alt)


@dataclass(frozen=True)
class LrCheck(JsonRecord):
    """The computed rate's short run against the defaults' at the same wall clock, and the verdict."""

    WHAT: ClassVar[str] = "the computed lr's short check"
    computed_lr: float
    default_lr: float | None
    batch_size: int
    seconds: float
    metric: str
    maximize: bool
    defaults_value: float | None
    computed_value: float | None
    defaults_steps: int
    computed_steps: int
    margin: float
    used: bool
    #: Where the defaults' figure was read off their own training: after this many epochs (None: a short run).
    defaults_epochs: int | None = None

    def describe(self) -> str:
        """One line: both short runs, and whether the search centres on the computed rate."""
        def fmt(v: float | None) -> str:
            return "-" if v is None else f"{v:.4g}"

        own = ("" if self.defaults_epochs is None else
               f", their own training after {self.defaults_epochs} epoch(s)")
        runs = (f"{self.seconds:.1f} s each from one seed: the computed lr {self.computed_lr:.3g} (batch "
                f"{self.batch_size}, {self.computed_steps} steps) reached {self.metric} {fmt(self.computed_value)}, "
                f"the defaults' lr {fmt(self.default_lr)} ({self.defaults_steps} steps{own}) "
                f"{fmt(self.defaults_value)}")
        if self.used:
            return f"{runs}: better by more than {self.margin:.3g}, so the search centres on the computed lr"
        return (f"{runs}: not better by more than {self.margin:.3g}, so the search centres on the defaults' lr "
                "(the computed one is a hypothesis this check did not confirm)")
