"""Which findings of the defaults' training stop optimize before any search: those whose cause is
not a param the search tunes (an lr too high is what the loop is for; unshuffled data is not)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["RATE_BLAMED", "SEARCHED_CAUSES", "searched_params", "stopping_findings", "tuned"]

#: Error findings caused by a param the search tunes, by that param: where it is searched the loop goes on.
SEARCHED_CAUSES = {**dict.fromkeys(("lr_too_high", "lr_too_low", "exploding_gradients", "oscillating_loss",
                                    "no_warmup"), "lr"), "batchnorm_small_batch": "batch_size"}


def searched_params(space: Any) -> frozenset[str]:
    """The params the search's space tunes (the default space: the rate and the batch among them)."""
    if space is None:
        return frozenset({"lr", "batch_size"})
    from ..search import load_space

    return frozenset(load_space(space).names)


#: Findings of the same training that put dead units down to the rate (a warning or worse): units
#: "dead from the first sampled step" at a rate 51x too high were alive at init (74% zeros, not 100%).
RATE_BLAMED = ("lr_too_high", "exploding_gradients", "oscillating_loss")


def _searched(finding: Any, params: frozenset[str], *, rate_blamed: bool = False) -> bool:
    """A param the search tunes is the cause (the rate, where units died while training, not from
    init, or where the same training's findings blame the rate)."""
    died_training = (finding.to_dict().get("evidence") or {}).get("dead_from_init") is False or rate_blamed
    return ("lr" if finding.cause == "dead_units" and died_training else SEARCHED_CAUSES.get(finding.cause)) in params


def tuned(finding: Any) -> str:
    """The param a searched finding is about, in words."""
    return "the batch size" if SEARCHED_CAUSES.get(finding.cause) == "batch_size" else "the learning rate"


def stopping_findings(findings: Sequence[Any], *, searched: frozenset[str]) -> list[Any]:
    """The error findings that stop the loop: every error but those whose cause the search tunes."""
    rate = any(f.cause in RATE_BLAMED and f.severity in ("warning", "error") for f in findings)
    return [f for f in findings if f.severity == "error" and not _searched(f, searched, rate_blamed=rate)]
