"""Slurm's time-limit syntax (sbatch --time), parsed the way sbatch reads it."""

from __future__ import annotations

import re

_FORMS = (
    # (regex, field names) in sbatch's documented order of precedence.
    (re.compile(r"(\d+)"), ("m",)),
    (re.compile(r"(\d+):(\d+)"), ("m", "s")),
    (re.compile(r"(\d+):(\d+):(\d+)"), ("h", "m", "s")),
    (re.compile(r"(\d+)-(\d+)"), ("d", "h")),
    (re.compile(r"(\d+)-(\d+):(\d+)"), ("d", "h", "m")),
    (re.compile(r"(\d+)-(\d+):(\d+):(\d+)"), ("d", "h", "m", "s")),
)
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_time(text: str) -> int:
    """Seconds in a Slurm time limit such as "90", "1:30:00" or "2-00:00"; ValueError if malformed."""
    value = str(text).strip()
    for pattern, names in _FORMS:
        match = pattern.fullmatch(value)
        if match:
            parts = zip(match.groups(), names, strict=True)
            seconds = sum(int(part) * _SECONDS[name] for part, name in parts)
            if seconds <= 0:
                raise ValueError(f"{text!r} is no time at all; give a positive limit such as 00:30:00")
            return seconds
    raise ValueError(
        f"{text!r} is not a Slurm time limit; use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
    )


def minutes_ceil(seconds: int) -> int:
    """Whole minutes, rounded up: submitit and sbatch take the limit in minutes."""
    return -(-seconds // 60)
