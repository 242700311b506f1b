"""A 95% interval for a ratio measured over paired units (windows, rounds of blocks): the units
drawn again with replacement, the ratio taken over each draw. Seeded: a run's figures print the
same twice."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

Unit = TypeVar("Unit")
RESAMPLES = 2000


def interval_95(units: Sequence[Unit], ratio: Callable[[Sequence[Unit]], float]) -> tuple[float, float]:
    draw = random.Random(0)
    ratios = sorted(ratio(draw.choices(units, k=len(units))) for _ in range(RESAMPLES))
    return ratios[int(0.025 * RESAMPLES)], ratios[int(0.975 * RESAMPLES) - 1]
