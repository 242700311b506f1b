"""How numbers read wherever slurmddp prints them (the live display, the result block, `status`,
`results`): one helper per kind of number, so that a speed or a time reads the same everywhere."""

from __future__ import annotations

import math
from dataclasses import dataclass

from slurmddp.rundir.layout import PERF

NOT_KNOWN = "?"


def rate(value: float) -> str:
    """A speed: `7,251`, `99.2`, `0.512`; three significant digits below 100, whole numbers with
    thousands separators from there on (never `1.089e+04`)."""
    if not math.isfinite(value):
        return NOT_KNOWN
    return f"{value:,.0f}" if value >= 99.95 else f"{value:.3g}"


def throughput(value: float, unit: str) -> str:
    """`7,251 samples/s`, `99.2 steps/s`."""
    return f"{rate(value)} {unit}/s"


@dataclass(frozen=True)
class Pace:
    """A throughput as a number: `per_s` of `unit` ("samples" or "steps") each second."""

    per_s: float
    unit: str


def pace_of(metrics: dict[str, float]) -> Pace | None:
    """The throughput of a telemetry record's `perf/` metrics: samples per second where the loop
    knows the batch (ctx.loader), else steps per second; None when the record has neither."""
    for unit in ("samples", "steps"):
        value = metrics.get(f"{PERF}{unit}_per_s")
        if value is not None:
            return Pace(float(value), unit)
    return None


def pace(metrics: dict[str, float]) -> str | None:
    """`pace_of` as text: "7,251 samples/s"."""
    found = pace_of(metrics)
    return None if found is None else throughput(found.per_s, found.unit)


def duration(seconds: float | None) -> str:
    """`H:MM:SS`, hours past a day included (`27:46:40`); `?` when not known."""
    if seconds is None or not math.isfinite(seconds):
        return NOT_KNOWN
    minutes, secs = divmod(max(round(seconds), 0), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def metric(value: float) -> str:
    """A metric's value to 4 significant digits: `0.9083`, `1235`, `3.000e-05`; `7` for 7.0."""
    # ctx.log keeps every value as a float: an epoch or a count reads as the whole number it is.
    if isinstance(value, int) or (math.isfinite(value) and value.is_integer() and abs(value) < 1e15):
        return str(int(value))
    # `#` keeps trailing zeros, so a live value does not jitter as digits come and go; it also
    # leaves a bare "." after a whole number ("1235."), which says nothing.
    return f"{value:#.4g}".rstrip(".")
