"""What the benchmarks that time paired rounds share: the interval of the median of the ratios."""

from __future__ import annotations

import random
import statistics


def median_interval(paired: list[float], draws: int = 2000) -> tuple[float, float]:
    """A bootstrap 95% interval of the median of the rounds' paired ratios (the machine's noise)."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(paired, k=len(paired))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]
